//! What kind of file an entry is: from the shared file system's file type, or a produced name's
//! record.

use super::names::Name;

/// A file's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Char,
    Block,
    Socket,
}

impl Kind {
    pub fn of(ft: std::fs::FileType) -> Kind {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_file() {
            Kind::File
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_char_device() {
            Kind::Char
        } else if ft.is_block_device() {
            Kind::Block
        } else if ft.is_socket() {
            Kind::Socket
        } else {
            Kind::Fifo
        }
    }

    /// The kind a produced name is.
    pub fn of_name(n: &Name) -> Kind {
        if n.dir {
            return Kind::Dir;
        }
        match n.meta.special {
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFCHR => Kind::Char,
            libc::S_IFBLK => Kind::Block,
            libc::S_IFSOCK => Kind::Socket,
            _ => Kind::File,
        }
    }

    /// The `S_IFMT` bits of a special kind a name may be made as (`mknod`, `symlink`).
    pub fn special_bits(mode: u32) -> Option<u32> {
        match mode & libc::S_IFMT {
            b @ (libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK) => Some(b),
            _ => None,
        }
    }
}
