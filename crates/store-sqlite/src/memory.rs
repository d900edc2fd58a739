//! SQLite's memory allocation, set once per process before its first connection.
//!
//! The writer thread is intake's bottleneck on SQLite, and a tenth of its time went to
//! SQLite's own allocations: glibc's `malloc` (SQLite's default), each call wrapped in
//! SQLite's global memory-statistics mutex (perf). Here SQLite allocates through
//! Rust's global allocator instead (mimalloc in the `onceprint` binary), and keeps no
//! memory statistics, which nothing in onceprint reads (no soft heap limit is set).
//!
//! SQLite accepts this configuration only before it initialises itself; after that
//! `sqlite3_config` refuses it and changes nothing, so a process whose SQLite was already
//! initialised (by a connection opened elsewhere first) simply keeps the defaults. An
//! allocator is never swapped under live allocations.

use std::alloc::{alloc, dealloc, realloc, Layout};
use std::os::raw::{c_int, c_void};
use std::sync::Once;

use rusqlite::ffi;

/// Every block starts with its total size, in a header that keeps SQLite's blocks 8-byte
/// aligned, as SQLite requires.
const HEADER: usize = 8;
const ALIGN: usize = 8;

fn layout(total: usize) -> Option<Layout> {
    Layout::from_size_align(total, ALIGN).ok()
}

unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let Some(total) = usize::try_from(n).ok().and_then(|n| n.checked_add(HEADER)) else { return std::ptr::null_mut() };
    let Some(layout) = layout(total) else { return std::ptr::null_mut() };
    // SAFETY: the layout has a non-zero size (at least the header).
    let base = unsafe { alloc(layout) };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `base` is valid for `total` bytes and 8-byte aligned.
    unsafe {
        (base as *mut usize).write(total);
        base.add(HEADER) as *mut c_void
    }
}

/// The start and total size of the block behind a pointer `x_malloc` or `x_realloc` gave.
///
/// # Safety
/// `p` must be such a pointer, not yet freed.
unsafe fn block(p: *mut c_void) -> (*mut u8, usize) {
    // SAFETY: per the contract, the header sits `HEADER` bytes before `p`.
    unsafe {
        let base = (p as *mut u8).sub(HEADER);
        (base, (base as *const usize).read())
    }
}

unsafe extern "C" fn x_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: SQLite frees only what its allocator gave it, once.
    unsafe {
        let (base, total) = block(p);
        if let Some(layout) = layout(total) {
            dealloc(base, layout);
        }
    }
}

unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    if p.is_null() {
        // SAFETY: same contract as `x_malloc`.
        return unsafe { x_malloc(n) };
    }
    let Some(total) = usize::try_from(n).ok().and_then(|n| n.checked_add(HEADER)) else { return std::ptr::null_mut() };
    // SAFETY: SQLite reallocates only what its allocator gave it; the old layout is the
    // one the block was allocated with, and `total` is non-zero.
    unsafe {
        let (base, old) = block(p);
        let Some(old_layout) = layout(old) else { return std::ptr::null_mut() };
        if layout(total).is_none() {
            return std::ptr::null_mut();
        }
        let moved = realloc(base, old_layout, total);
        if moved.is_null() {
            return std::ptr::null_mut();
        }
        (moved as *mut usize).write(total);
        moved.add(HEADER) as *mut c_void
    }
}

unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: SQLite asks only about live blocks of its allocator.
    let (_, total) = unsafe { block(p) };
    c_int::try_from(total - HEADER).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
    n.checked_add(7).map_or(n, |m| m & !7)
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

static CONFIGURE: Once = Once::new();

/// Sets SQLite's allocator and turns its memory statistics off, if SQLite has not been
/// initialised yet in this process. Called before every connection this crate opens.
pub(crate) fn configure() {
    CONFIGURE.call_once(|| {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(x_malloc),
            xFree: Some(x_free),
            xRealloc: Some(x_realloc),
            xSize: Some(x_size),
            xRoundup: Some(x_roundup),
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: both calls pass the argument types these options take; SQLite copies
        // the methods struct (its functions live for the whole process) and refuses, with
        // SQLITE_MISUSE and no change, once it is initialised.
        let (memstatus, malloc) = unsafe {
            (
                ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int),
                ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &methods as *const ffi::sqlite3_mem_methods),
            )
        };
        if memstatus != ffi::SQLITE_OK || malloc != ffi::SQLITE_OK {
            tracing::debug!(memstatus, malloc, "SQLite was initialised before onceprint configured it; defaults kept");
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn blocks_keep_their_contents_through_growth_and_shrinking() {
        // Through SQLite's own entry points, whichever allocator it ended up with.
        super::configure();
        // SAFETY: plain use of SQLite's allocation API.
        unsafe {
            let p = rusqlite::ffi::sqlite3_malloc(10) as *mut u8;
            assert!(!p.is_null());
            assert!(rusqlite::ffi::sqlite3_msize(p as *mut _) >= 10);
            assert_eq!(p as usize % 8, 0, "8-byte aligned");
            for i in 0..10 {
                p.add(i).write(i as u8);
            }
            let q = rusqlite::ffi::sqlite3_realloc(p as *mut _, 100_000) as *mut u8;
            assert!(!q.is_null());
            assert!(rusqlite::ffi::sqlite3_msize(q as *mut _) >= 100_000);
            assert_eq!((0..10).map(|i| q.add(i).read()).collect::<Vec<_>>(), (0..10).collect::<Vec<u8>>());
            let r = rusqlite::ffi::sqlite3_realloc(q as *mut _, 4) as *mut u8;
            assert_eq!((0..4).map(|i| r.add(i).read()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
            rusqlite::ffi::sqlite3_free(r as *mut _);
        }
    }
}
