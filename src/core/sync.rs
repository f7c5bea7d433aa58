//! Locks that outlive a panic: a thread that panicked while holding one leaves data that is
//! still consistent in every use here (each critical section is a few map or counter updates),
//! so the others go on instead of panicking in turn.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The locks and condition variable of code whose interleavings are explored with shuttle
/// (`cargo test --features shuttle`): std's in every build without that feature.
pub mod model {
    #[cfg(feature = "shuttle")]
    pub use shuttle::sync::{Condvar, Mutex, MutexGuard, RwLock};
    #[cfg(not(feature = "shuttle"))]
    pub use std::sync::{Condvar, Mutex, MutexGuard, RwLock};

    /// Locks `m`, ignoring poisoning (as [`super::lock`] does a std lock).
    pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}
