//! Back ends. There is one: PTX (`back::ptx`).

pub mod ptx;
