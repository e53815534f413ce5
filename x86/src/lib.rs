//! `vtrace-x86`: the x86-64 architecture as every part of vtrace needs it,
//! on the ground floor (no other vtrace crate below it), so that the VMM,
//! the tracer, the debugger, the analyzer and any engine that runs a guest
//! share one answer to each question:
//!
//! - the architecture's constants (RFLAGS, control registers, EFER,
//!   page-table entries, IDT gates, the 64-bit TSS);
//! - a CPU's registers as vtrace sees them ([`Registers`],
//!   [`SpecialRegisters`]), with KVM's conversions behind the `kvm`
//!   feature;
//! - page walks over any [`PhysicalMemory`] ([`Walker`], [`WalksNow`]);
//! - what an instruction does: where it sends control
//!   ([`Flow`]) and which of its memory accesses the registers around it
//!   give a value for ([`Rule`], [`registers_give_values`]).

mod facts;
#[cfg(feature = "kvm")]
mod kvm;
mod paging;
mod registers;
mod semantics;

pub use facts::{
    cr0, cr4, dr, efer, gate32_handler, has_error_code, msr, pf_error, pte, real_mode_vector,
    rflags, tss64, Gate64,
};
pub use paging::{PageAccess, PhysicalMemory, Walker, WalksNow};
pub use registers::{DescriptorTable, Registers, Segment, SpecialRegisters};
pub use semantics::{
    memory_operands, near_target, registers_give_values, Flow, Operand, Rule, Source,
};
