//! How chunks move between nodes once a pull connection is authenticated: on the sealed
//! control stream only ([`DataPlane::stream`], the default where UCX would emulate RMA in
//! software), or also by UCX RMA gets ([`DataPlane::ucx`], opt-in).
//!
//! With UCX, the worker runs in a data-plane process of its own ([`super::ucx::child`]):
//! unprivileged, without the job secret, sharing with the daemon only the slab of staged
//! chunks. Whatever reaches UCX (on tcp, UCX's software RMA reads and writes any address of the
//! process it runs in) reaches that process only. The daemon treats the shared slab as hostile
//! memory: a holder stages, checksums and seals a chunk in its own memory and copies the
//! ciphertext into the slab for the get (so what UCX exposes there reveals no file's bytes); a
//! puller copies a gotten chunk out of the slab before opening its seal (so nothing without the
//! job key changes a byte of it), and reads inline chunks into its own memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::ucx::child::Child;
use super::ucx::{Completion, NoResult, PeerId, PeerInfo, Slab, Slot, UcxError};

pub struct DataPlane {
    /// The daemon's own slots: inline chunks, staging, checks.
    private: Arc<Slab>,
    ucx: Option<Child>,
    /// Shared slots lent to peers now (never the last eighth: [`DataPlane::take_lendable`]).
    lent: Arc<AtomicUsize>,
}

/// A shared slot lent to a peer's get; dropping it (released, or its lease over) returns it.
pub struct Lent {
    slot: Slot,
    count: Arc<AtomicUsize>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DataPlane {
    /// Chunks travel on the sealed control stream only; no UCX worker, nothing listening but
    /// the control port.
    pub fn stream(slots: usize, slot_size: usize) -> std::io::Result<DataPlane> {
        Ok(DataPlane {
            private: Arc::new(Slab::new(slots, slot_size)?),
            ucx: None,
            lent: Default::default(),
        })
    }

    /// Chunks above the eager size travel by UCX RMA, through a data-plane process of its own
    /// with a shared slab of `slots` slots. `background`: its progress thread runs at the
    /// lowest CPU priority (`--replicate`'s copies). `tls`: the UCX_TLS the process is given
    /// (`None`: the daemon's).
    pub fn ucx(
        slots: usize,
        slot_size: usize,
        background: bool,
        tls: Option<&str>,
    ) -> Result<DataPlane, UcxError> {
        let private = Slab::new(slots, slot_size).map_err(|e| UcxError::io("mmap", e))?;
        Ok(DataPlane {
            private: Arc::new(private),
            ucx: Some(Child::start(slots, slot_size, background, tls)?),
            lent: Default::default(),
        })
    }

    /// `ucx`: [`DataPlane::ucx`], else [`DataPlane::stream`].
    pub fn new(
        ucx: bool,
        slots: usize,
        slot_size: usize,
        background: bool,
        tls: Option<&str>,
    ) -> Result<DataPlane, UcxError> {
        if ucx {
            DataPlane::ucx(slots, slot_size, background, tls)
        } else {
            DataPlane::stream(slots, slot_size).map_err(|e| UcxError::io("mmap", e))
        }
    }

    /// The daemon's own slots.
    pub fn slab(&self) -> &Arc<Slab> {
        &self.private
    }

    /// Whether chunks may go by UCX now: a data-plane process is running (while one that died
    /// is restarted, connections made meanwhile move every chunk inline).
    pub fn has_ucx(&self) -> bool {
        self.ucx.as_ref().is_some_and(Child::alive)
    }

    /// What a peer needs to get from this node's shared slab, if chunks may go by UCX now
    /// (read once per connection, so its hello and its endpoint agree).
    pub fn info(&self) -> Option<PeerInfo> {
        self.ucx.as_ref().filter(|c| c.alive()).map(Child::info)
    }

    /// Creates an endpoint to a peer's data-plane process.
    pub fn connect(&self, info: PeerInfo, timeout: Duration) -> Result<PeerId, UcxError> {
        match &self.ucx {
            Some(c) => c.connect(info, timeout),
            None => Err(UcxError::gone("connect")),
        }
    }

    pub fn disconnect(&self, peer: PeerId) {
        if let Some(c) = &self.ucx {
            c.disconnect(peer);
        }
    }

    /// A shared slot to lend to a peer's get, waiting at most `wait`; `None` without UCX. An
    /// eighth of the shared slots (at least one) is never lent: it stays for this node's own
    /// gets, so two nodes pulling from each other never each hold every slot the other's gets
    /// wait for.
    pub fn take_lendable(&self, wait: Duration) -> Option<Lent> {
        let c = self.ucx.as_ref()?;
        let slots = c.slab().len() / c.slab().slot_size();
        let cap = slots.saturating_sub((slots / 8).max(1)).max(1);
        if self.lent.fetch_add(1, Ordering::Relaxed) >= cap {
            self.lent.fetch_sub(1, Ordering::Relaxed);
            std::thread::sleep(wait);
            return None;
        }
        match c.slab().take(wait) {
            Some(slot) => Some(Lent {
                slot,
                count: self.lent.clone(),
            }),
            None => {
                self.lent.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Copies a staged chunk (in one of our own slots) into `shared`, a lent slot of the shared
    /// slab, for a peer's get; returns the address the peer gets from.
    pub fn lend(&self, staged: &Slot, len: usize, shared: &mut Lent) -> u64 {
        shared
            .slot
            .bytes_mut(len)
            .copy_from_slice(staged.bytes(len));
        self.ucx.as_ref().map_or(0, |c| c.remote_addr(&shared.slot))
    }

    /// Gets `len` bytes at a peer's `remote_addr` into a shared slot; once the get is done they
    /// are copied into `into`, a slot of our own.
    pub fn get(
        &self,
        peer: PeerId,
        remote_addr: u64,
        into: Slot,
        len: usize,
        wait: Duration,
    ) -> Result<Getting, UcxError> {
        let c = self
            .ucx
            .as_ref()
            .ok_or_else(|| UcxError::gone("ucp_get_nbx"))?;
        let shared = c
            .slab()
            .take(wait)
            .ok_or_else(|| UcxError::gone("a free shared slot"))?;
        Ok(Getting {
            done: c.get(peer, remote_addr, shared, len),
            len,
            into,
        })
    }
}

/// A get on its way.
pub struct Getting {
    done: Completion<(Slot, Result<(), UcxError>)>,
    len: usize,
    into: Slot,
}

impl Getting {
    /// Waits (at most `t`) for the get and copies its bytes into a slot of our own (the shared
    /// slot may change under us: nothing is checked in it).
    pub fn finish(self, t: Duration) -> Result<Slot, Result<UcxError, NoResult>> {
        let (shared, r) = self.done.wait(t).map_err(Err)?;
        r.map_err(Ok)?;
        let mut mine = self.into;
        mine.bytes_mut(self.len)
            .copy_from_slice(shared.bytes(self.len));
        Ok(mine)
    }
}
