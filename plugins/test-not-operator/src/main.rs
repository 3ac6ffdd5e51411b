//! A WebAssembly command (`wasi:cli/command`), not a Sluice operator: the host must refuse
//! to load it as one and say which world it expected.

fn main() {
    println!("test-not-operator: this is a command, not a sluice:operator component");
}
