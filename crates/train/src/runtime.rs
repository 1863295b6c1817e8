//! Process-wide settings for a training or benchmarking process, applied once at start-up by
//! the `transformer` command ([`configure`]).
//!
//! # Keeping freed memory ([`keep_freed_memory`])
//! A step of the tutorial language model allocates and frees several buffers of 23-26 MB: the
//! output layer's and embedding's gradients, and candle's gradient accumulators (candle adds
//! each gradient into a `zeros_like` of its parameter, then into a fresh sum). glibc serves
//! blocks of that size with `mmap` and returns them with `munmap`, so every step touches about
//! 30,000 new pages, each a page fault (11% of a step went to page faults, measured with perf
//! on the project's 2-core machines). With the thresholds below, glibc serves them from its
//! heap and keeps freed memory for the next step instead; the process's peak memory is what
//! it was, it is only not handed back between steps.
//!
//! Only processes that train do this. One that decodes or serves allocates its large
//! buffers once (the weights, their packed forms) and frees the copies that loading and
//! preparing made on the way; held back in the heap they count in its resident memory for
//! as long as it runs (45 MB more peak RSS for beam search at the paper's base size, whose
//! time was the same within the noise).
//!
//! # A shorter spin for candle's thread pool ([`shorter_pool_spin`])
//! candle's CPU pool workers spin for 25,000 `pause` instructions (a millisecond or more)
//! after each op before they sleep. Between the many small ops of a backward pass they hardly
//! ever sleep, and the fused kernels' own threads then share a core with a spinning worker.
//! With 3,000 the bf16 training step took 134-157 ms against 156-196 ms with the default,
//! and the fp32 step 190-220 against 203-238 ms (three interleaved pairs of
//! `transformer bench lm` on the 2-core machine).

/// Applies [`shorter_pool_spin`], and [`keep_freed_memory`] when the process runs training
/// steps (`training`). Call first thing in `main`, while the process has one thread and
/// before any tensor exists.
pub fn configure(training: bool) {
    if training {
        keep_freed_memory();
    }
    shorter_pool_spin();
}

/// Spin limit for candle's pool workers, unless `CANDLE_BARRIER_POOL_SPIN_LIMIT` is set.
pub const POOL_SPIN_LIMIT: u32 = 3_000;

/// Sets `CANDLE_BARRIER_POOL_SPIN_LIMIT` to [`POOL_SPIN_LIMIT`] when the user has not set it.
/// candle reads it once, when its pool starts (the first CPU op), so this must run before.
pub fn shorter_pool_spin() {
    const VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";
    if std::env::var_os(VAR).is_none() {
        std::env::set_var(VAR, POOL_SPIN_LIMIT.to_string());
    }
}

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
