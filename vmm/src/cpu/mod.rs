//! What the vCPU looks like to the guest (CPUID) and the register state each
//! boot protocol starts it in.

pub mod cpuid;
pub(crate) mod echo;
pub mod entry;
pub mod soft_int;
pub mod unemulated;
