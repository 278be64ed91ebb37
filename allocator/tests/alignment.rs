//! The allocator, as the global allocator of this test, gives every layout its alignment and its
//! bytes: plain and aligned calls, zeroed memory, and reallocation across the two.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};

use animal_store_allocator::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

const ALIGNS: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 4096, 65536];

/// Sizes around every small bin and past the sizes the fast path serves.
fn sizes() -> impl Iterator<Item = usize> {
    (1..=300).chain((300..5000).step_by(37)).chain([
        8191,
        8192,
        65536,
        65537,
        1 << 20,
        (1 << 20) + 24,
    ])
}

/// Whether the `len` bytes at `p` are all `byte`.
///
/// # Safety
/// `p` must be valid for reads of `len` bytes.
unsafe fn all(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: the caller's.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|&b| b == byte)
}

#[test]
fn every_layout_gets_its_alignment_and_its_bytes() {
    for align in ALIGNS {
        for size in sizes() {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: no layout has size zero; each block is used within its size, and freed
            // (or reallocated) with the layout it has.
            unsafe {
                let zeroed = GLOBAL.alloc_zeroed(layout);
                assert!(!zeroed.is_null(), "zeroed {layout:?}");
                assert_eq!(zeroed as usize % align, 0, "zeroed {layout:?}");
                assert!(all(zeroed, size, 0), "zeroed {layout:?}");
                GLOBAL.dealloc(zeroed, layout);

                let mut p = GLOBAL.alloc(layout);
                assert!(!p.is_null(), "{layout:?}");
                assert_eq!(p as usize % align, 0, "{layout:?}");
                p.write_bytes(0xA5, size);
                // Grown and shrunk, across the sizes the plain and the aligned calls take.
                let mut current = size;
                for new_size in [size * 3, 15, size + 1] {
                    let old = Layout::from_size_align(current, align).unwrap();
                    let q = GLOBAL.realloc(p, old, new_size);
                    assert!(!q.is_null(), "{old:?} to {new_size}");
                    assert_eq!(q as usize % align, 0, "{old:?} to {new_size}");
                    assert!(
                        all(q, current.min(new_size), 0xA5),
                        "{old:?} to {new_size}: contents kept"
                    );
                    q.write_bytes(0xA5, new_size);
                    (p, current) = (q, new_size);
                }
                GLOBAL.dealloc(p, Layout::from_size_align(current, align).unwrap());
            }
        }
    }
}

#[test]
fn collections_on_the_global_allocator_keep_their_contents() {
    let mut strings: Vec<String> = (0..10_000).map(|i| format!("pet {i}")).collect();
    strings.retain(|s| s.len() % 2 == 0);
    let joined: String = strings.concat();
    assert_eq!(
        strings.len(),
        90 + 9_000,
        "the numbers of two and of four digits"
    );
    assert!(joined.starts_with("pet 10pet 11"));
    let boxes: Vec<Box<[u128; 3]>> = (0..1000u128).map(|i| Box::new([i; 3])).collect();
    assert!(
        boxes
            .iter()
            .enumerate()
            .all(|(i, b)| b[2] == i as u128 && (&**b as *const _ as usize).is_multiple_of(16))
    );
}
