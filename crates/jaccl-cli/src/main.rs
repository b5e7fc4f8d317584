//! The `jaccl` command.

fn main() {}
