//! What an instruction does, as vtrace's tracer and analyzer both need it,
//! decided here once: where it sends control ([`Flow`]) and where the
//! value of each of its memory accesses comes from ([`Rule`]), with
//! [`registers_give_values`] (whether the tracer must read them from
//! memory) derived from that same table.

mod flow;
mod operands;

pub use flow::{near_target, Flow};
pub use operands::{memory_operands, registers_give_values, Operand, Rule, Source};
