//! Keeping freed memory for reuse, so that the large buffers of every training step do not
//! fault in fresh pages each time.
//!
//! A step of the tutorial language model allocates and frees several buffers of 23-26 MB: the
//! output layer's and embedding's gradients, and candle's gradient accumulators (candle adds
//! each gradient into a `zeros_like` of its parameter, then into a fresh sum). glibc serves
//! blocks of that size with `mmap` and returns them with `munmap`, so every step touches about
//! 30,000 new pages, each a page fault (`../shared/NOTES.md` measured 11% of a step in page
//! faults). With the thresholds below, glibc serves them from its heap and keeps freed memory
//! for the next step instead; the process's peak memory is what it was, it is only not handed
//! back between steps.

/// Raises glibc's `mmap` threshold to its maximum (32 MB on 64-bit) and its trim threshold to
/// 1 GB. Call once at start-up, before the first large allocation. Does nothing on other C
/// libraries and operating systems. Returns whether both settings were accepted.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes two allocator parameters; both values are in range.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
