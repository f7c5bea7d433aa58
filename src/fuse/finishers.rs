//! Threads kept for work a request thread must not do itself (a flush whose opener has
//! children: see `Ops::flush`): an idle one takes the next job, else a new one starts; one idle
//! for [`IDLE`] ends. (Starting a thread per job cost a producer's close 60-75 us.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::core::sync::lock;

/// How long a kept thread waits for a job before it ends.
const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// The kept threads' jobs, and how many of them wait for one.
pub struct Finishers {
    name: &'static str,
    jobs: Sender<Job>,
    shared: Arc<Shared>,
}

struct Shared {
    taken: Receiver<Job>,
    /// Threads waiting for a job that no job sent is meant for yet. A job claims one before it
    /// is sent (or starts a thread of its own), and a thread ends only if it can take itself
    /// off this count: no job is ever left in the channel with nobody to take it.
    idle: Mutex<usize>,
}

impl Finishers {
    pub fn new(name: &'static str) -> Finishers {
        let (jobs, taken) = crossbeam_channel::unbounded();
        Finishers {
            name,
            jobs,
            shared: Arc::new(Shared {
                taken,
                idle: Mutex::new(0),
            }),
        }
    }

    /// Runs `job` on an idle kept thread, or on a new one.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let claimed = {
            let mut idle = lock(&self.shared.idle);
            let claimed = *idle > 0;
            *idle -= usize::from(claimed);
            claimed
        };
        if claimed {
            self.jobs
                .send(Box::new(job))
                .expect("the receiver lives as long as the sender");
            return Ok(());
        }
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || {
                job();
                shared.serve();
            })
            .map(drop)
    }
}

impl Shared {
    /// A kept thread: waits for jobs and runs them, until idle for [`IDLE`].
    fn serve(&self) {
        loop {
            *lock(&self.idle) += 1;
            let job = match self.taken.recv_timeout(IDLE) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    let mut idle = lock(&self.idle);
                    if *idle > 0 {
                        // Unclaimed: this thread's place goes with it.
                        *idle -= 1;
                        return;
                    }
                    // Every waiting place was claimed: a job is on its way to one of them.
                    drop(idle);
                    match self.taken.recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            job();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::mpsc;

    /// Jobs one after another reuse one kept thread; jobs at once each get a thread (none
    /// waits behind another: here they wait for each other, and would never end).
    #[test]
    fn an_idle_thread_takes_the_next_job_and_busy_ones_start_more() {
        let f = Finishers::new("finisher-test");
        let mut ids = HashSet::new();
        for _ in 0..20 {
            let (tx, rx) = mpsc::channel();
            f.run(move || tx.send(std::thread::current().id()).unwrap())
                .unwrap();
            ids.insert(rx.recv().unwrap());
            // Its thread waits for the next job again.
            while *lock(&f.shared.idle) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(ids.len(), 1, "jobs one after another share a thread");
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let (tx, rx) = mpsc::channel();
        for _ in 0..4 {
            let (barrier, tx) = (barrier.clone(), tx.clone());
            f.run(move || {
                barrier.wait();
                tx.send(std::thread::current().id()).unwrap();
            })
            .unwrap();
        }
        let at_once: HashSet<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(at_once.len(), 4);
    }
}
