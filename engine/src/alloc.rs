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

/// Sets the allocator's thresholds, on glibc; elsewhere, nothing (other allocators keep freed
/// memory by design). Call it before the process allocates much, and before it starts threads.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT as libc::c_int);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MAPPED_FROM as libc::c_int);
    }
}
