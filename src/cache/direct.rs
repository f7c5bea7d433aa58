//! O_DIRECT reads of cached chunks, for peers and for daemon-served reads (see
//! `Entry::read_avoiding_page_cache`): bytes that are not in the page cache are read with
//! O_DIRECT, so that serving them neither costs a page-cache copy nor pushes this node's own
//! working set out.

/// Whether `room[..len]` at `offset` can be read with O_DIRECT: block-aligned, with room for
/// the last block whole.
pub(super) fn aligned_for_direct(offset: u64, room: &[u8], len: usize) -> bool {
    const BLOCK: usize = crate::core::source::DIRECT_ALIGN;
    offset.is_multiple_of(BLOCK as u64)
        && (room.as_ptr() as usize).is_multiple_of(BLOCK)
        && len.next_multiple_of(BLOCK) <= room.len()
}

/// Reads at least `room[..len]` at `offset` of `direct` (opened O_DIRECT), rounded up to whole
/// blocks; `false` if unaligned or failed.
pub(super) fn read_direct_with(
    direct: &std::fs::File,
    offset: u64,
    room: &mut [u8],
    len: usize,
) -> bool {
    if !aligned_for_direct(offset, room, len) {
        return false;
    }
    let padded = len.next_multiple_of(crate::core::source::DIRECT_ALIGN);
    // A short count only at the end of the file, past `len`.
    matches!(
        crate::sys::read_at_least(direct, &mut room[..padded], offset, len),
        Ok(n) if n >= len
    )
}
