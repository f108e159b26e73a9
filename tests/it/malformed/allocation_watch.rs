//! The allocation watch: the largest single allocation request of the
//! process, for the tests that assert that a hostile length (a length field of
//! 2^64 - 1, a tensor of a terabyte, an index of 100 MB) led to no attempt to
//! allocate anything of its size.
//!
//! A `#[global_allocator]` is the whole test binary's, and every module's
//! tests run beside these in it: a high-water mark of the test process would
//! see what any other test allocates meanwhile (the 528 MiB streamed by
//! `stream`, a 100 MB header read), and pass or fail by chance. So a watched
//! test runs its body in a child process that runs it alone
//! (`common::child::run_alone`), where the process's mark is the load's, as it
//! was when `malformed` was a test binary of its own; the measuring function
//! refuses to run anywhere else.
//!
//! NOTE: rejected (2026-12): a mark per thread, since a load allocates on
//! rayon's and its own reader threads, which every test's loads share; and a
//! lock, which holds off only the tests that take it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::common::child::ROLE;

/// Forwards to the system allocator and, while armed, remembers the largest
/// request.
struct LargestAllocation;

/// Whether the watch counts: only in a child, inside
/// [`largest_allocation_during`]; elsewhere the allocator only forwards.
static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if ARMED.load(Ordering::Relaxed) {
        LARGEST_ALLOCATION.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards its arguments to `System` unchanged, so the
// `GlobalAlloc` contract is `System`'s; the only addition is two atomics,
// which do not allocate.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc_zeroed`'s contract, passed on as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller upholds `realloc`'s contract, passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract, passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// More than any load of these small files needs (the nesting bombs'
/// parsers reach 1 MiB), and far less than the 100 MB and more that the files
/// claim.
pub(super) const SMALL: usize = 16 << 20;

/// Runs `f` and returns the largest single allocation the process requested
/// meanwhile. Only in a child process that runs this test alone (see the
/// module's docs).
pub(crate) fn largest_allocation_during(f: impl FnOnce()) -> usize {
    assert!(
        std::env::var_os(ROLE).is_some(),
        "the watch sees the whole process: measure in a child (`run_alone`)"
    );
    LARGEST_ALLOCATION.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    f();
    ARMED.store(false, Ordering::Relaxed);
    LARGEST_ALLOCATION.load(Ordering::Relaxed)
}
