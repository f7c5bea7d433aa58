//! How the node's disk is shared: fairly between users first, then between each user's
//! datasets. Every user who reads datasets on the node (attached one since its cache was made)
//! has an equal part of the node's capacity (at most `--user-max`), split equally among the
//! datasets the user reads; a dataset may hold the sum of the parts its users give it (at most
//! `--dataset-max`). A user of ten datasets so holds no more of the disk than a user of one, and
//! a dataset two users read is worth both of their parts: one copy serves them both.

use std::collections::BTreeMap;

/// Who gives a dataset its room: its users, or, for a dataset no user is known of yet (its
/// record lost), the dataset itself, as one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    User(u32),
    Itself(usize),
}

/// The bounds the admin set.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub user_max: Option<u64>,
    pub dataset_max: Option<u64>,
}

/// Each dataset's room, in the order given, from the node's `capacity` and each dataset's
/// users.
pub fn shares(capacity: u64, users: &[Vec<u32>], limits: Limits) -> Vec<u64> {
    let mut of: BTreeMap<Owner, Vec<usize>> = BTreeMap::new();
    for (i, us) in users.iter().enumerate() {
        if us.is_empty() {
            of.entry(Owner::Itself(i)).or_default().push(i);
        }
        for &u in us {
            of.entry(Owner::User(u)).or_default().push(i);
        }
    }
    let mut room = vec![0u64; users.len()];
    if of.is_empty() {
        return room;
    }
    let part = capacity / of.len() as u64;
    for (owner, datasets) in &of {
        let part = match owner {
            Owner::User(_) => part.min(limits.user_max.unwrap_or(u64::MAX)),
            Owner::Itself(_) => part,
        };
        for &d in datasets {
            room[d] += part / datasets.len() as u64;
        }
    }
    let cap = limits.dataset_max.unwrap_or(u64::MAX);
    room.iter_mut().for_each(|r| *r = (*r).min(cap));
    room
}

/// The bytes each user is charged for: each dataset's cached bytes split equally among its
/// users, by uid.
pub fn charged(datasets: &[(Vec<u32>, u64)]) -> BTreeMap<u32, (usize, u64)> {
    let mut out: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
    for (users, bytes) in datasets {
        for &u in users {
            let e = out.entry(u).or_default();
            e.0 += 1;
            e.1 += bytes / users.len() as u64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Limits = Limits {
        user_max: None,
        dataset_max: None,
    };

    #[test]
    fn users_share_the_disk_equally_whatever_their_datasets() {
        // User 1 reads three datasets, user 2 one: each user has half the disk.
        let r = shares(1200, &[vec![1], vec![1], vec![1], vec![2]], NONE);
        assert_eq!(r, [200, 200, 200, 600]);
        // A dataset both read is worth both parts.
        let r = shares(1200, &[vec![1, 2], vec![1]], NONE);
        assert_eq!(r, [300 + 600, 300]);
        // One user alone: all of it, split among its datasets, as before there were users.
        assert_eq!(shares(1536, &[vec![0], vec![0]], NONE), [768, 768]);
    }

    #[test]
    fn a_dataset_of_unknown_users_counts_as_one_and_limits_bound() {
        let r = shares(900, &[vec![], vec![1], vec![2]], NONE);
        assert_eq!(r, [300, 300, 300]);
        let limits = Limits {
            user_max: Some(100),
            dataset_max: Some(250),
        };
        let r = shares(900, &[vec![], vec![1], vec![1, 2]], limits);
        // The unknown dataset's part is not a user's: only --dataset-max bounds it.
        assert_eq!(r, [250, 50, 50 + 100]);
        assert!(shares(900, &[], NONE).is_empty());
    }

    #[test]
    fn each_user_is_charged_its_part_of_what_it_reads() {
        let c = charged(&[(vec![1, 2], 1000), (vec![1], 300)]);
        assert_eq!(c[&1], (2, 800));
        assert_eq!(c[&2], (1, 500));
    }
}
