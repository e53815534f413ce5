//! The C ABI of `bochs/cabi/vtrace_bochs.h`, mirrored: change both
//! together and bump [`ABI`].

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The ABI this binding speaks (`VTB_ABI`).
pub(crate) const ABI: c_int = 3;

/// `vtb_host`.
#[repr(C)]
pub(crate) struct Host {
    pub(crate) ctx: *mut c_void,
    pub(crate) ram: *mut u8,
    pub(crate) ram_len: u64,
    pub(crate) mmio_read: extern "C" fn(*mut c_void, c_uint, u64, c_uint) -> u64,
    pub(crate) mmio_write: extern "C" fn(*mut c_void, c_uint, u64, c_uint, u64),
    pub(crate) port_in: extern "C" fn(*mut c_void, c_uint, u16, c_uint) -> u32,
    pub(crate) port_out: extern "C" fn(*mut c_void, c_uint, u16, c_uint, u32),
    pub(crate) step: extern "C" fn(*mut c_void, c_uint) -> u32,
    pub(crate) acknowledge: extern "C" fn(*mut c_void, c_uint) -> u8,
    pub(crate) cpuid: extern "C" fn(*mut c_void, c_uint, u32, u32, *mut u32) -> c_int,
    pub(crate) tsc: extern "C" fn(*mut c_void, c_uint, *mut u64) -> c_int,
    pub(crate) event: extern "C" fn(*mut c_void, c_uint, c_int, c_uint, u32) -> u32,
    pub(crate) log: extern "C" fn(*mut c_void, c_int, *const c_char),
}

/// `vtb_segment`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// The base address.
    pub base: u64,
    /// The limit, in bytes (scaled by the granularity bit).
    pub limit: u32,
    /// The selector.
    pub selector: u16,
    /// The attributes as VMX's access rights: type, S, DPL and P in bits
    /// 0-7; AVL, L, D/B and G in bits 12-15.
    pub attributes: u16,
}

/// `vtb_fpu`: the x87 and SSE state, in FXSAVE's order of registers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fpu {
    /// The control word.
    pub fcw: u16,
    /// The status word (TOP in bits 11-13).
    pub fsw: u16,
    /// The full tag word: two bits a register, as FSTENV stores it.
    pub ftw: u16,
    /// The last instruction's opcode.
    pub fop: u16,
    /// The last instruction's pointer.
    pub fip: u64,
    /// The last operand's pointer.
    pub fdp: u64,
    /// The last instruction's code segment.
    pub fcs: u16,
    /// The last operand's data segment.
    pub fds: u16,
    /// MXCSR.
    pub mxcsr: u32,
    /// ST(0) to ST(7): the 64-bit significand, then sign and exponent.
    pub st: [[u8; 16]; 8],
    /// XMM0 to XMM15.
    pub xmm: [[u8; 16]; 16],
}

/// `vtb_msrs`: the MSRs a kernel uses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Msrs {
    /// IA32_STAR.
    pub star: u64,
    /// IA32_LSTAR.
    pub lstar: u64,
    /// IA32_CSTAR.
    pub cstar: u64,
    /// IA32_FMASK.
    pub fmask: u64,
    /// IA32_KERNEL_GS_BASE.
    pub kernel_gs_base: u64,
    /// IA32_SYSENTER_CS.
    pub sysenter_cs: u64,
    /// IA32_SYSENTER_ESP.
    pub sysenter_esp: u64,
    /// IA32_SYSENTER_EIP.
    pub sysenter_eip: u64,
    /// IA32_PAT.
    pub pat: u64,
    /// IA32_APIC_BASE, as the guest reads it (Bochs's own local APIC stays
    /// off whatever it says).
    pub apic_base: u64,
    /// IA32_TSC_AUX.
    pub tsc_aux: u64,
}

/// `vtb_state`: a CPU's architectural state, as a hand-over moves it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15.
    pub gpr: [u64; 16],
    /// The instruction pointer.
    pub rip: u64,
    /// The flags.
    pub rflags: u64,
    /// ES, CS, SS, DS, FS, GS, then LDTR and TR.
    pub seg: [Segment; 8],
    /// The GDT's base.
    pub gdt_base: u64,
    /// The IDT's base.
    pub idt_base: u64,
    /// The GDT's limit.
    pub gdt_limit: u16,
    /// The IDT's limit.
    pub idt_limit: u16,
    /// CR0.
    pub cr0: u64,
    /// CR2.
    pub cr2: u64,
    /// CR3.
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER.
    pub efer: u64,
    /// XCR0.
    pub xcr0: u64,
    /// DR0-DR3, DR6, DR7.
    pub dr: [u64; 6],
    /// The MSRs a kernel uses.
    pub msrs: Msrs,
    /// The x87 and SSE state.
    pub fpu: Fpu,
    /// Where the CPU stands (see [`crate::Activity`]).
    pub activity: u32,
    /// What blocks interrupts after the last instruction:
    /// [`BLOCKED_BY_STI`], [`BLOCKED_BY_MOV_SS`] (VMX's interruptibility
    /// state).
    pub interruptibility: u32,
}

/// [`State::interruptibility`]: the shadow of an STI that just ran.
pub const BLOCKED_BY_STI: u32 = 1;
/// [`State::interruptibility`]: the shadow of a MOV SS or POP SS that
/// just ran.
pub const BLOCKED_BY_MOV_SS: u32 = 2;

pub(crate) type AbiFn = unsafe extern "C" fn() -> c_int;
pub(crate) type CreateFn = unsafe extern "C" fn(*const Host, c_uint) -> c_int;
pub(crate) type GetStateFn = unsafe extern "C" fn(c_uint, *mut State, c_uint);
pub(crate) type SetStateFn = unsafe extern "C" fn(c_uint, *const State, c_uint);
pub(crate) type InvalidateFn = unsafe extern "C" fn(u64, u64);
pub(crate) type InRepeatFn = unsafe extern "C" fn(c_uint) -> c_int;
pub(crate) type InsnStartFn = unsafe extern "C" fn(c_uint) -> u64;
pub(crate) type SetIntrFn = unsafe extern "C" fn(c_uint, c_int);
pub(crate) type RunFn = unsafe extern "C" fn(c_uint, u64, *mut u64) -> c_int;

/// `VTB_CORE`: what changes at every step.
pub(crate) const CORE: c_uint = 1;
/// `VTB_ALL`.
pub(crate) const ALL: c_uint = 3;

/// `VTB_STEP_END`.
pub(crate) const STEP_END: u32 = 1;
/// `VTB_STEP_INTR`.
pub(crate) const STEP_INTR: u32 = 2;
/// `VTB_EVENT_EXTERNAL`.
pub(crate) const EVENT_EXTERNAL: c_int = 0;
/// `VTB_EVENT_SOFTWARE`.
pub(crate) const EVENT_SOFTWARE: c_int = 2;
