//! What a backing file's POSIX ACL means for the mode bits the mount presents. The kernel
//! judges every access to the mount by those bits alone (`default_permissions`), so an ACL
//! entry that denies a user what the mode bits allow others would be bypassed under
//! `allow_other`. The mount presents bits narrowed so that no class gets more than every ACL
//! entry that could apply to its members: never more than the ACL allows anyone, possibly
//! less (a user whom a named entry grants more than the mode bits reads as the mode bits say).

/// The attribute holding a file's access ACL.
pub const ACL_XATTR: &std::ffi::CStr = c"system.posix_acl_access";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// The permission bits (of 0o7777) the mount may present for a file whose access ACL is
/// `xattr` (the kernel's `posix_acl_xattr` format: a version, then 8-byte entries of tag,
/// permissions and id, little-endian). `None` if it cannot be read as one: the caller then
/// presents the owner's bits only.
pub fn allowed_bits(xattr: &[u8]) -> Option<u16> {
    let (head, entries) = xattr.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != VERSION || entries.len() % 8 != 0 {
        return None;
    }
    let (mut mask, mut group_obj, mut other) = (7u16, None, None);
    // The least any named entry allows (before the mask), for users and for groups.
    let (mut named_users, mut named_groups) = (None::<u16>, None::<u16>);
    let least = |n: Option<u16>, perm| Some(n.map_or(perm, |n| n & perm));
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]) & 7;
        match tag {
            USER_OBJ => {}
            USER => named_users = least(named_users, perm),
            GROUP_OBJ => group_obj = Some(perm),
            GROUP => named_groups = least(named_groups, perm),
            MASK => mask = perm,
            OTHER => other = Some(perm),
            _ => return None,
        }
    }
    let (group_obj, other) = (group_obj?, other?);
    let (users, groups) = (
        named_users.map_or(7, |p| p & mask),
        named_groups.map_or(7, |p| p & mask),
    );
    // A member of the owning group who is also a named user gets that user's entry; one who
    // is also in a named group gets the union, never less than the owning group's entry.
    let group = group_obj & mask & users;
    // Anyone else: a named user or group entry if one matches, else the others' entry.
    let others = other & users & groups;
    Some(0o7700 | group << 3 | others)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend(tag.to_le_bytes());
            v.extend(perm.to_le_bytes());
            v.extend(id.to_le_bytes());
        }
        v
    }

    const ANY: u32 = u32::MAX;

    #[test]
    fn a_named_deny_narrows_the_classes_it_could_hide_in() {
        // rw-r--r-- with user:bob:--- : bob would read as "other" through the mount.
        let bob_denied = acl(&[
            (USER_OBJ, 6, ANY),
            (USER, 0, 1000),
            (GROUP_OBJ, 4, ANY),
            (MASK, 4, ANY),
            (OTHER, 4, ANY),
        ]);
        assert_eq!(allowed_bits(&bob_denied), Some(0o7700));
        // A named group that may read takes nothing away.
        let group_reads = acl(&[
            (USER_OBJ, 6, ANY),
            (GROUP_OBJ, 4, ANY),
            (GROUP, 5, 100),
            (MASK, 5, ANY),
            (OTHER, 4, ANY),
        ]);
        assert_eq!(allowed_bits(&group_reads), Some(0o7744));
        // The mask limits the owning group and every named entry, not the owner or others.
        let masked = acl(&[
            (USER_OBJ, 7, ANY),
            (USER, 7, 1000),
            (GROUP_OBJ, 7, ANY),
            (MASK, 1, ANY),
            (OTHER, 5, ANY),
        ]);
        assert_eq!(allowed_bits(&masked), Some(0o7711));
        // A mask alone narrows the owning group only.
        let mask_only = acl(&[
            (USER_OBJ, 7, ANY),
            (GROUP_OBJ, 7, ANY),
            (GROUP, 5, 100),
            (MASK, 5, ANY),
            (OTHER, 5, ANY),
        ]);
        assert_eq!(allowed_bits(&mask_only), Some(0o7755));
    }

    #[test]
    fn what_is_not_an_acl_is_refused() {
        assert_eq!(allowed_bits(&[]), None);
        assert_eq!(allowed_bits(&[2, 0, 0, 0, 1]), None);
        assert_eq!(allowed_bits(&acl(&[(USER_OBJ, 6, ANY)])), None);
        let mut wrong = acl(&[(USER_OBJ, 6, ANY), (GROUP_OBJ, 4, ANY), (OTHER, 4, ANY)]);
        wrong[0] = 3;
        assert_eq!(allowed_bits(&wrong), None);
        assert_eq!(
            allowed_bits(&acl(&[(USER_OBJ, 6, ANY), (0x40, 4, ANY)])),
            None
        );
    }
}
