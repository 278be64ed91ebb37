//! `passthrough LISTEN UPSTREAM`: the library's pass-through, with mimalloc as the gateway's
//! binary has it.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    animal_store_passthrough::main();
}
