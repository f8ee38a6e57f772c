//! How the process treats memory it frees.
//!
//! glibc's malloc gives freed memory back to the kernel as soon as a free leaves more than a
//! threshold unused at the top of a heap, and serves blocks over a second threshold from their
//! own mappings, unmapped when freed. Both thresholds start at 128 KiB and move with the sizes
//! it has seen freed. An engine frees a run's whole payload when the run ends and builds the
//! next run's anew, so with the defaults every run past the moving threshold takes its memory
//! from the kernel again, one page fault per 4 KiB page — at 4,000 `foreach` items, over a third
//! of the run's time, while smaller runs reuse theirs: a cost per item that jumps with N.
//!
//! [`keep_freed_memory`] fixes both thresholds: up to [`KEPT`] of freed memory stays with the
//! process for the next run, and blocks under [`MAPPED_FROM`] come from the heap. Peak memory is
//! unchanged; memory after a peak is given back only past [`KEPT`]. The `switchyard` binary
//! calls it first thing; a program embedding the engine decides for itself (the benchmark
//! harness calls it, to measure the engine as the binary runs it).

/// Freed memory the process keeps before giving any back.
pub const KEPT: usize = 64 << 20;

/// Blocks of this size and over get their own mapping.
pub const MAPPED_FROM: usize = 32 << 20;

/// Sets the allocator's thresholds, on glibc, and says whether it took both; elsewhere it does
/// nothing and says so (other allocators keep freed memory by design). Call it before the
/// process allocates much, and before it starts threads.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before other threads exist.
    unsafe {
        let kept = libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT as libc::c_int);
        let mapped = libc::mallopt(libc::M_MMAP_THRESHOLD, MAPPED_FROM as libc::c_int);
        kept == 1 && mapped == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Free bytes the allocator holds, in all its arenas.
    fn held() -> usize {
        // SAFETY: `mallinfo2` only reads the allocator's counters.
        unsafe { libc::mallinfo2() }.fordblks
    }

    #[test]
    fn a_freed_block_stays_with_the_process() {
        assert!(super::keep_freed_memory());
        // Under the mapping threshold and the kept amount: it comes from a heap and stays in
        // it once freed. With glibc's defaults it would be mapped, and unmapped when freed.
        let size = 16 << 20;
        let block = std::hint::black_box(vec![1u8; size]);
        let during = held();
        drop(block);
        let after = held();
        assert!(
            after >= during + size - (1 << 20),
            "{} MiB free while the block was in use, {} MiB after freeing its {} MiB",
            during >> 20,
            after >> 20,
            size >> 20
        );
    }
}
