"""A stand-in for tensorflow, which DLIO imports at start even when it runs the PyTorch reader
(its TF profiler, framework and reader modules are imported unconditionally). Nothing of it is
used on the pytorch/npz path; any use fails loudly instead of silently doing nothing.
Put this directory on PYTHONPATH only for DLIO runs."""


class _Absent:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} called: tensorflow is only a stand-in here")

    def __mro_entries__(self, bases):
        # Module-level `class X(tf.keras.Something)` definitions still import.
        return (object,)


def __getattr__(name):
    return _Absent(f"tensorflow.{name}")
