//! The names protocol's calls, typed: each question a node asks a directory's name home, the
//! message it goes out as and the one reply it may get back. The home's side of the same calls
//! is `service/name_home.rs` (answered by `service/answer.rs`'s dispatch); a node's side asks
//! through these (`cluster/names.rs` adds the failover and the waits) and never builds
//! a [`Msg`] itself, so a call's request and its reply change in one place.

use crate::core::names::Name;
use crate::core::{NodeId, Version};

use super::error::LocatorError;
use super::names::OVER_QUOTA;
use super::proto::Msg;

/// A question for a name home: its message, and what its reply means.
pub trait NameCall {
    type Answer;
    /// The message the question goes out as.
    fn msg(&self) -> Msg;
    /// What the home's reply says, or why it is not a reply to this question.
    fn answer(reply: Msg) -> Result<Self::Answer, LocatorError>;
}

/// The name `dir/name` now (`None`: not published).
pub struct Get<'a> {
    pub dir: &'a str,
    pub name: &'a str,
}

impl NameCall for Get<'_> {
    type Answer = Option<Name>;
    fn msg(&self) -> Msg {
        Msg::NameGet {
            dir: self.dir.into(),
            name: self.name.into(),
            wait_ms: 0,
        }
    }
    fn answer(reply: Msg) -> Result<Option<Name>, LocatorError> {
        match reply {
            Msg::NameIs(n) => Ok(n),
            m => Err(unexpected(m)),
        }
    }
}

/// A page of `dir`'s names after `after`: the names, and whether more follow.
pub struct List<'a> {
    pub dir: &'a str,
    pub after: Option<&'a str>,
}

impl NameCall for List<'_> {
    type Answer = (Vec<(String, Name)>, bool);
    fn msg(&self) -> Msg {
        Msg::NameList {
            dir: self.dir.into(),
            after: self.after.map(str::to_string),
        }
    }
    fn answer(reply: Msg) -> Result<Self::Answer, LocatorError> {
        match reply {
            Msg::Names { names, more } => Ok((names, more)),
            m => Err(unexpected(m)),
        }
    }
}

/// Publishes (or, `None`, removes) `dir/name`; the name it replaced. A home refuses an owner
/// who has as many names as one user may ([`OverQuota`]).
pub struct Set<'a> {
    pub dir: &'a str,
    pub name: &'a str,
    pub entry: Option<Name>,
}

/// A [`Set`] refused: the owner has as many names as one user may (the home's words).
#[derive(Debug)]
pub struct OverQuota(pub String);

impl NameCall for Set<'_> {
    type Answer = Result<Option<Name>, OverQuota>;
    fn msg(&self) -> Msg {
        Msg::NameSet {
            dir: self.dir.into(),
            name: self.name.into(),
            entry: self.entry.clone(),
        }
    }
    fn answer(reply: Msg) -> Result<Self::Answer, LocatorError> {
        match reply {
            Msg::NameIs(n) => Ok(Ok(n)),
            Msg::Refused(why) if why.starts_with(OVER_QUOTA) => Ok(Err(OverQuota(why))),
            m => Err(unexpected(m)),
        }
    }
}

/// Registers node `node`'s readers' waits for `names` (directory, name) for `wait_ms`; those
/// published already, as (directory, name, name).
pub struct Watch<'a> {
    pub node: NodeId,
    pub names: &'a [(String, String)],
    pub wait_ms: u64,
}

impl NameCall for Watch<'_> {
    type Answer = Vec<(String, String, Name)>;
    fn msg(&self) -> Msg {
        Msg::NameWatch {
            node: self.node,
            names: self.names.to_vec(),
            wait_ms: self.wait_ms,
        }
    }
    fn answer(reply: Msg) -> Result<Self::Answer, LocatorError> {
        match reply {
            Msg::NamesAre(found) => Ok(found),
            m => Err(unexpected(m)),
        }
    }
}

/// Tells an object's holder that no name points at `object` (of `version`) any more (`drop`:
/// unlinked, so its bytes may go at once). Sent to the holder, not to a name home; best effort:
/// a holder that is not told keeps an evictable copy.
pub struct Unhold<'a> {
    pub object: &'a str,
    pub version: Version,
    pub drop: bool,
}

impl NameCall for Unhold<'_> {
    type Answer = ();
    fn msg(&self) -> Msg {
        Msg::Unhold {
            object: self.object.into(),
            version: self.version,
            drop: self.drop,
        }
    }
    fn answer(_: Msg) -> Result<(), LocatorError> {
        Ok(())
    }
}

fn unexpected(m: Msg) -> LocatorError {
    LocatorError::UnexpectedReply(Box::new(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_takes_only_its_own_reply() {
        let got = Get {
            dir: "d",
            name: "n",
        };
        assert!(matches!(got.msg(), Msg::NameGet { wait_ms: 0, .. }));
        assert_eq!(Get::answer(Msg::NameIs(None)).unwrap(), None);
        assert!(Get::answer(Msg::NamesAre(Vec::new())).is_err());
        let page = List::answer(Msg::Names {
            names: Vec::new(),
            more: true,
        });
        assert_eq!(page.unwrap(), (Vec::new(), true));
        assert!(List::answer(Msg::NameIs(None)).is_err());
        let over = Set::answer(Msg::Refused(format!("{OVER_QUOTA} uid 7"))).unwrap();
        assert!(matches!(over, Err(OverQuota(_))));
        assert!(Set::answer(Msg::Refused("no".into())).is_err());
        assert!(Watch::answer(Msg::NameIs(None)).is_err());
    }
}
