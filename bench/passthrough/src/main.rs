//! `passthrough LISTEN UPSTREAM`: the library's pass-through, with the allocator the gateway's
//! binary has (`allocator/`: mimalloc).

#[global_allocator]
static GLOBAL: animal_store_allocator::MiMalloc = animal_store_allocator::MiMalloc;

fn main() {
    animal_store_passthrough::main();
}
