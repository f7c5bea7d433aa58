//! Why the locator could not answer or serve, as a type: these travel inside the `io::Error`s of
//! the `Source` and `Namespace` ports (`io::Error::new(kind, LocatorError)`, so the filesystem's
//! errno table sees the kind and a log sees the whole reason; `downcast_ref` gets it back).

use std::io;

use super::proto::Msg;
use crate::core::NodeId;

#[derive(Debug, thiserror::Error)]
pub enum LocatorError {
    #[error("producer {producer} of {path} could not serve it")]
    ProducerUnreachable { producer: NodeId, path: String },
    #[error("no holder named by the feed could serve {0}")]
    FeedHoldersFailed(String),
    #[error("name home {0} unreachable")]
    NameHomeUnreachable(NodeId),
    #[error("unexpected reply from a name home: {0:?}")]
    UnexpectedReply(Box<Msg>),
    #[error("bad name from its home: {0}")]
    BadName(String),
}

impl From<LocatorError> for io::Error {
    fn from(e: LocatorError) -> io::Error {
        let kind = match e {
            LocatorError::ProducerUnreachable { .. }
            | LocatorError::FeedHoldersFailed(_)
            | LocatorError::NameHomeUnreachable(_) => io::ErrorKind::HostUnreachable,
            LocatorError::UnexpectedReply(_) | LocatorError::BadName(_) => {
                io::ErrorKind::InvalidData
            }
        };
        io::Error::new(kind, e)
    }
}
