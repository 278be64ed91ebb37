//! The memory of the limiter's slot arrays ([`crate::state_table`]): an array of 2 MiB or more
//! gets a mapping of its own, aligned to 2 MiB and advised for transparent huge pages.
//!
//! A decision among a million keys reads one slot from a table of about 100 MB, so nearly every
//! decision misses the TLB too, and the processor walks the page tables before it can load the
//! slot. In 2 MiB pages most of the table takes a few dozen TLB entries instead of some 20,000:
//! `cargo bench`, alternating builds, measured a decision at 1M keys in 69.6-78.1 ns with the
//! slots mostly in huge pages, against 86.8-98.2 ns in 4 KiB pages, beside one load from memory
//! of 126-150 ns (`bench/results.md`).
//!
//! On a kernel whose THP mode is `madvise`, the usual default, only regions that ask get huge
//! pages, and the binary's allocator (mimalloc, built with `no_thp`) asks for none: the
//! limiter's large arrays are the only memory of the process in huge pages, and the RSS of idle
//! connections stays as it was. Where THP is off, the advice is ignored and the slots are in
//! ordinary pages, as smaller arrays always are: smaller arrays stay on the heap.
//!
//! A mapping of its own also goes back to the system whole when its array is dropped.
#![allow(unsafe_code)]

use std::num::NonZeroUsize;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A transparent huge page where the base page is 4 KiB (x86-64, and arm64 as usually built).
const HUGE_PAGE: usize = 2 << 20;

/// The base page size these mappings assume; elsewhere every array stays on the heap.
const BASE_PAGE: usize = 4096;

/// A fixed number of `T`, each a copy of one value at first.
pub struct SlotMemory<T> {
    ptr: NonNull<T>,
    len: usize,
    /// The length of the array's own mapping (from `ptr`), or `None` for the heap.
    mapped: Option<NonZeroUsize>,
}

// SAFETY: a `SlotMemory` owns its `T`s as a `Box<[T]>` does; nothing else points into them.
unsafe impl<T: Send> Send for SlotMemory<T> {}
// SAFETY: as above; `&SlotMemory` gives only `&[T]`.
unsafe impl<T: Sync> Sync for SlotMemory<T> {}

impl<T: Copy> SlotMemory<T> {
    /// `len` copies of `value`.
    pub fn new(len: usize, value: T) -> SlotMemory<T> {
        let bytes = len.saturating_mul(size_of::<T>());
        if bytes >= HUGE_PAGE
            && page_size() == Some(BASE_PAGE)
            && let Some(memory) = SlotMemory::mapped(len, bytes, value)
        {
            return memory;
        }
        let boxed = vec![value; len].into_boxed_slice();
        SlotMemory {
            // Never null: a `Box`'s pointer, dangling but aligned when `len` is 0.
            ptr: NonNull::from(Box::leak(boxed)).cast(),
            len,
            mapped: None,
        }
    }

    /// `len` copies of `value` in a mapping of their own, aligned to [`HUGE_PAGE`] and advised
    /// for huge pages; `None` if the system gives no such mapping.
    fn mapped(len: usize, bytes: usize, value: T) -> Option<SlotMemory<T>> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, munmap};

        // A huge page more than the array, so an aligned start lies within; the ends around the
        // aligned array are given back at once.
        let reserved = bytes.checked_add(HUGE_PAGE)?.next_multiple_of(BASE_PAGE);
        // SAFETY: a new private anonymous mapping, which aliases nothing.
        let base = unsafe {
            mmap_anonymous(
                None,
                NonZeroUsize::new(reserved)?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .ok()?;
        let base_addr = base.as_ptr() as usize;
        let start = base_addr.next_multiple_of(HUGE_PAGE);
        let kept = bytes.next_multiple_of(BASE_PAGE);
        let head = start - base_addr;
        let tail = reserved - head - kept;
        // SAFETY: both ranges are whole pages of the mapping just made, outside the part kept,
        // and nothing points into them.
        unsafe {
            if head > 0 {
                let _ = munmap(base, head);
            }
            if tail > 0 {
                let _ = munmap(base.byte_add(head + kept), tail);
            }
        }
        let ptr = base.map_addr(|_| NonZeroUsize::new(start).expect("within a mapping"));
        #[cfg(target_os = "linux")]
        {
            use nix::sys::mman::{MmapAdvise, madvise};
            // Advice, not a demand: a kernel without THP, or that has it off for this process,
            // refuses or ignores it, and the slots are in base pages. Given before any page is
            // touched, so the first touch of each 2 MiB takes a huge page.
            // SAFETY: the range is the part of the mapping kept; advice changes no contents.
            let _ = unsafe { madvise(ptr, kept, MmapAdvise::MADV_HUGEPAGE) };
        }
        let ptr: NonNull<T> = ptr.cast();
        for i in 0..len {
            // SAFETY: `i` is within the `bytes` kept, which are writable; `ptr` is aligned to
            // 2 MiB, more than any `T` needs.
            unsafe { ptr.add(i).write(value) };
        }
        Some(SlotMemory {
            ptr,
            len,
            mapped: NonZeroUsize::new(kept),
        })
    }

    /// Whether the array is in a mapping of its own (and advised for huge pages).
    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }
}

impl<T> SlotMemory<T> {
    /// The bytes the array holds: its mapping's whole pages, or its length in `T`s on the heap
    /// (where the allocator's own rounding and keeping are not counted).
    pub fn bytes(&self) -> usize {
        match self.mapped {
            Some(kept) => kept.get(),
            None => self.len * size_of::<T>(),
        }
    }
}

impl<T> Default for SlotMemory<T> {
    /// No `T` at all, holding no memory.
    fn default() -> SlotMemory<T> {
        SlotMemory {
            ptr: NonNull::dangling(),
            len: 0,
            mapped: None,
        }
    }
}

impl<T> Deref for SlotMemory<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialized `T`s at `ptr`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for SlotMemory<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for SlotMemory<T> {
    fn drop(&mut self) {
        match self.mapped {
            // SAFETY: the part of its mapping this array kept, which is given back whole. Only
            // `Copy` values are ever put in a mapping, so none needs dropping.
            Some(kept) => unsafe {
                let _ = nix::sys::mman::munmap(self.ptr.cast(), kept.get());
            },
            // SAFETY: the pointer and length of the `Box<[T]>` leaked in `new`.
            None => unsafe {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                )));
            },
        }
    }
}

/// The system's base page size.
fn page_size() -> Option<usize> {
    use nix::unistd::{SysconfVar, sysconf};
    static SIZE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|n| usize::try_from(n).ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array is its length's copies of the value, and writable, wherever it is kept.
    #[test]
    fn an_array_holds_its_values_on_the_heap_or_in_a_mapping() {
        #[derive(Clone, Copy, PartialEq, Debug)]
        #[repr(align(64))]
        struct Line([u64; 8]);
        for len in [
            0,
            1,
            1000,
            HUGE_PAGE / 64 - 1,
            HUGE_PAGE / 64,
            3 * HUGE_PAGE / 64 + 17,
        ] {
            let mut memory = SlotMemory::new(len, Line([7; 8]));
            assert_eq!(memory.len(), len);
            assert!(memory.iter().all(|l| *l == Line([7; 8])));
            assert_eq!(memory.is_mapped(), len * 64 >= HUGE_PAGE, "{len} lines");
            let whole_pages = (len * 64).next_multiple_of(BASE_PAGE);
            let bytes = if memory.is_mapped() {
                whole_pages
            } else {
                len * 64
            };
            assert_eq!(memory.bytes(), bytes, "{len} lines");
            if memory.is_mapped() {
                assert_eq!(
                    memory.as_ptr() as usize % HUGE_PAGE,
                    0,
                    "aligned to a huge page"
                );
            }
            if let Some(last) = memory.last_mut() {
                *last = Line([9; 8]);
            }
            assert_eq!(memory.last().map(|l| l.0[0]), (len > 0).then_some(9));
        }
        assert!(SlotMemory::<Line>::default().is_empty());
    }

    /// The flags of the mapping that holds `addr` (`/proc/self/smaps`), if one does.
    fn mapping_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut holds = false;
        for line in smaps.lines() {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                if holds {
                    return Some(flags.trim().to_owned());
                }
            } else if let Some((range, _)) = line.split_once(' ')
                && let Some((start, end)) = range.split_once('-')
                && let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                )
            {
                holds = (start..end).contains(&addr);
            }
        }
        None
    }

    /// A large array is advised for huge pages, and its mapping is given back when it is
    /// dropped.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_mapped_array_is_advised_for_huge_pages_and_unmapped_when_dropped() {
        let memory = SlotMemory::new(8 * HUGE_PAGE / 8, 1u64);
        assert!(memory.is_mapped());
        let addr = memory.as_ptr() as usize;
        let flags = mapping_flags(addr).expect("the array's own mapping");
        // `hg`: advised for huge pages, where the kernel has them at all.
        if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            assert!(flags.split(' ').any(|f| f == "hg"), "flags {flags}");
        }
        drop(memory);
        // Another mapping may take the address, but not one advised as this one was.
        let after = mapping_flags(addr).unwrap_or_default();
        assert!(
            !after.split(' ').any(|f| f == "hg"),
            "still mapped: {after}"
        );
    }
}
