//! One CPU's local APIC, in user space (xAPIC, memory-mapped at
//! [`BASE`]): its ID, the task priority, the interrupt request and
//! in-service registers, the interrupt command register that sends IPIs
//! (INIT and STARTUP included), and its timer on the virtual clock.
//!
//! Why in user space and not KVM's (`KVM_CREATE_IRQCHIP`, or the split
//! irqchip that keeps only the local APICs in the kernel): KVM's local APIC
//! timer runs on host time and its HLT blocks in the kernel, so a traced
//! guest's timer interrupts would land wherever the host's clock put them
//! and no two traces would agree. Here the timer reads the VMM's virtual
//! clock, which counts steps while tracing, and the VMM injects every
//! interrupt itself, as it does for the PIC. The cost is an MMIO exit per
//! register access, which a single-stepped guest pays anyway (one exit per
//! instruction).
//!
//! The register file follows Intel's SDM vol. 3A, 11.4 ("Local APIC"); the
//! device decides; the run loop routes the IPIs it sends.

use crate::clock::VirtualNanos;

/// Guest-physical address of every CPU's local APIC page (each CPU sees
/// its own there).
pub const BASE: u64 = 0xfee0_0000;
/// Size of the page.
pub const SIZE: u64 = 0x1000;

/// The timer's input clock before the divider: 100 MHz, 10 ns a tick.
const TIMER_TICK_NS: u64 = 10;

const REG_ID: u64 = 0x20;
const REG_VERSION: u64 = 0x30;
const REG_TPR: u64 = 0x80;
const REG_PPR: u64 = 0xa0;
const REG_EOI: u64 = 0xb0;
const REG_LDR: u64 = 0xd0;
const REG_DFR: u64 = 0xe0;
const REG_SVR: u64 = 0xf0;
const REG_ISR: u64 = 0x100;
const REG_IRR: u64 = 0x200;
const REG_ICR_LOW: u64 = 0x300;
const REG_ICR_HIGH: u64 = 0x310;
const REG_LVT_TIMER: u64 = 0x320;
const REG_LVT_LAST: u64 = 0x370;
const REG_TIMER_INITIAL: u64 = 0x380;
const REG_TIMER_CURRENT: u64 = 0x390;
const REG_TIMER_DIVIDE: u64 = 0x3e0;

/// Version 0x14 (an integrated APIC), six LVT entries (timer to error).
const VERSION: u32 = 0x0005_0014;
const LVT_MASKED: u32 = 1 << 16;
const LVT_PERIODIC: u32 = 1 << 17;
const SVR_ENABLED: u32 = 1 << 8;

/// What an ICR write asks for (SDM 11.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpiKind {
    /// A fixed (or lowest-priority, taken as fixed) interrupt with this vector.
    Fixed(u8),
    /// INIT: the target waits for a STARTUP.
    Init,
    /// STARTUP: the target starts in real mode at `vector << 12`.
    Startup(u8),
    /// An NMI.
    Nmi,
}

/// Whom an IPI goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// The CPU whose APIC ID is this (0xff: every CPU).
    Physical(u8),
    /// The CPUs whose logical ID (flat model) shares a bit with this mask.
    Logical(u8),
    /// The sender only.
    SelfOnly,
    /// Every CPU, the sender included.
    All,
    /// Every CPU but the sender.
    AllButSelf,
}

impl Destination {
    /// The CPUs it names, for an interrupt from `sender`. `ids` gives each
    /// CPU's (APIC ID, logical ID); the flat logical model, as Linux and
    /// the demo use it.
    pub fn targets(self, sender: usize, ids: &[(u8, u8)]) -> Vec<usize> {
        let all = 0..ids.len();
        match self {
            Destination::SelfOnly => vec![sender],
            Destination::All | Destination::Physical(0xff) => all.collect(),
            Destination::AllButSelf => all.filter(|&c| c != sender).collect(),
            Destination::Physical(id) => all.filter(|&c| ids[c].0 == id).collect(),
            Destination::Logical(mask) => all.filter(|&c| ids[c].1 & mask != 0).collect(),
        }
    }
}

/// An inter-processor interrupt a CPU sent by writing its ICR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipi {
    /// What it delivers.
    pub kind: IpiKind,
    /// To whom.
    pub destination: Destination,
}

impl Ipi {
    /// Decodes an ICR write, or `None` for what needs no delivery (INIT
    /// level de-assert, SMI, reserved modes).
    pub fn decode(low: u32, high: u32) -> Option<Ipi> {
        let vector = low.to_le_bytes()[0];
        let kind = match (low >> 8) & 7 {
            0 | 1 => IpiKind::Fixed(vector),
            4 => IpiKind::Nmi,
            // Level de-assert (level 0, trigger level): an 82489DX relic.
            5 if low & (1 << 14) == 0 && low & (1 << 15) != 0 => return None,
            5 => IpiKind::Init,
            6 => IpiKind::Startup(vector),
            _ => return None,
        };
        let target = high.to_le_bytes()[3];
        let destination = match (low >> 18) & 3 {
            1 => Destination::SelfOnly,
            2 => Destination::All,
            3 => Destination::AllButSelf,
            _ if low & (1 << 11) != 0 => Destination::Logical(target),
            _ => Destination::Physical(target),
        };
        Some(Ipi { kind, destination })
    }
}

/// The timer while it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Countdown {
    /// When it reaches zero next.
    fires_at: VirtualNanos,
    /// Nanoseconds a full count takes.
    period: u64,
}

/// One CPU's local APIC.
#[derive(Clone, Debug)]
pub struct LocalApic {
    id: u8,
    tpr: u32,
    ldr: u32,
    dfr: u32,
    svr: u32,
    irr: [u32; 8],
    isr: [u32; 8],
    icr_high: u32,
    /// Timer, thermal, performance, LINT0, LINT1, error.
    lvt: [u32; 6],
    timer_initial: u32,
    timer_divide: u32,
    countdown: Option<Countdown>,
}

impl LocalApic {
    /// The APIC of the CPU with APIC ID `id`, in its power-on state
    /// (software-disabled, every LVT entry masked).
    pub fn new(id: u8) -> Self {
        LocalApic {
            id,
            tpr: 0,
            ldr: 0,
            dfr: u32::MAX,
            svr: 0xff,
            irr: [0; 8],
            isr: [0; 8],
            icr_high: 0,
            lvt: [LVT_MASKED; 6],
            timer_initial: 0,
            timer_divide: 0,
            countdown: None,
        }
    }

    /// Its APIC ID.
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Its logical ID in the flat model (LDR bits 24-31).
    pub fn logical_id(&self) -> u8 {
        self.ldr.to_le_bytes()[3]
    }

    /// A 32-bit read at `offset` in the page.
    pub fn read(&self, offset: u64, now: VirtualNanos) -> u32 {
        let bank = |regs: &[u32; 8], base: u64| {
            let i = usize::try_from((offset & !0xf).saturating_sub(base) >> 4).unwrap_or(0);
            regs.get(i).copied().unwrap_or(0)
        };
        match offset & !0xf {
            REG_ID => u32::from(self.id) << 24,
            REG_VERSION => VERSION,
            REG_TPR => self.tpr,
            REG_PPR => self.processor_priority(),
            REG_LDR => self.ldr,
            REG_DFR => self.dfr,
            REG_SVR => self.svr,
            REG_ISR..=0x170 => bank(&self.isr, REG_ISR),
            REG_IRR..=0x270 => bank(&self.irr, REG_IRR),
            // Delivery is immediate: the status bit (12) always reads idle.
            REG_ICR_LOW => 0,
            REG_ICR_HIGH => self.icr_high,
            o @ REG_LVT_TIMER..=REG_LVT_LAST => self.lvt[lvt_index(o)],
            REG_TIMER_INITIAL => self.timer_initial,
            REG_TIMER_CURRENT => self.current_count(now),
            REG_TIMER_DIVIDE => self.timer_divide,
            _ => 0,
        }
    }

    /// A 32-bit write at `offset`; returns the IPI an ICR write sends.
    pub fn write(&mut self, offset: u64, value: u32, now: VirtualNanos) -> Option<Ipi> {
        match offset & !0xf {
            REG_TPR => self.tpr = value & 0xff,
            REG_EOI => self.end_of_interrupt(),
            REG_LDR => self.ldr = value & 0xff00_0000,
            REG_DFR => self.dfr = value | 0x0fff_ffff,
            REG_SVR => self.svr = value & 0x13ff,
            REG_ICR_LOW => return Ipi::decode(value, self.icr_high),
            REG_ICR_HIGH => self.icr_high = value & 0xff00_0000,
            o @ REG_LVT_TIMER..=REG_LVT_LAST => {
                let masked = if self.enabled() { 0 } else { LVT_MASKED };
                self.lvt[lvt_index(o)] = value | masked;
                if o == REG_LVT_TIMER {
                    self.restart_timer(now);
                }
            }
            REG_TIMER_INITIAL => {
                self.timer_initial = value;
                self.restart_timer(now);
            }
            REG_TIMER_DIVIDE => self.timer_divide = value & 0xb,
            _ => {}
        }
        None
    }

    /// Software-enabled (SVR bit 8): it takes fixed interrupts.
    pub fn enabled(&self) -> bool {
        self.svr & SVR_ENABLED != 0
    }

    /// Latches `vector` in the IRR (a fixed interrupt arrived).
    pub fn accept(&mut self, vector: u8) {
        // Vectors 0-15 are illegal for fixed delivery (SDM 11.5.2).
        if vector >= 16 {
            let (word, bit) = bit_of(vector);
            self.irr[word] |= bit;
        }
    }

    /// The vector the CPU would take now: the highest requested one whose
    /// priority class is above the processor priority.
    pub fn pending_vector(&self) -> Option<u8> {
        if !self.enabled() {
            return None;
        }
        let vector = highest(&self.irr)?;
        (u32::from(vector) & 0xf0 > self.processor_priority() & 0xf0).then_some(vector)
    }

    /// The CPU takes the pending vector: it moves from IRR to ISR.
    pub fn acknowledge(&mut self) -> Option<u8> {
        let vector = self.pending_vector()?;
        let (word, bit) = bit_of(vector);
        self.irr[word] &= !bit;
        self.isr[word] |= bit;
        Some(vector)
    }

    /// The timer's next expiry, if it counts.
    pub fn next_deadline(&self) -> Option<VirtualNanos> {
        self.countdown.map(|c| c.fires_at)
    }

    /// Fires the timer if its time has come (at most once per call: a
    /// periodic timer that fell behind catches up without a burst). A
    /// periodic timer keeps its phase: it fires next at the first whole
    /// period after `now`, not a period after it was served, so over time
    /// it counts as many periods as the PIT counts its own (Linux checks
    /// the one against the other before it trusts this timer).
    pub fn update(&mut self, now: VirtualNanos) {
        let Some(c) = self.countdown else { return };
        if now < c.fires_at {
            return;
        }
        let lvt = self.lvt[0];
        if lvt & LVT_MASKED == 0 {
            self.accept(lvt.to_le_bytes()[0]);
        }
        self.countdown = (lvt & LVT_PERIODIC != 0).then(|| {
            // `period` is not 0: a countdown of 0 is never made.
            let periods = (now - c.fires_at) / c.period.max(1) + 1;
            Countdown {
                fires_at: c.fires_at.saturating_add(periods.saturating_mul(c.period)),
                period: c.period,
            }
        });
    }

    fn restart_timer(&mut self, now: VirtualNanos) {
        let period = u64::from(self.timer_initial)
            .saturating_mul(self.divisor())
            .saturating_mul(TIMER_TICK_NS);
        self.countdown = (period > 0).then(|| Countdown {
            fires_at: now.saturating_add(period),
            period,
        });
    }

    fn current_count(&self, now: VirtualNanos) -> u32 {
        let Some(c) = self.countdown else { return 0 };
        let left = c.fires_at.saturating_sub(now) / (self.divisor() * TIMER_TICK_NS);
        u32::try_from(left).unwrap_or(u32::MAX)
    }

    /// Divide configuration (bits 0, 1 and 3) to divisor: 2, 4, ... 128, 1.
    fn divisor(&self) -> u64 {
        let code = (self.timer_divide & 3) | ((self.timer_divide >> 1) & 4);
        1 << ((code + 1) & 7)
    }

    fn processor_priority(&self) -> u32 {
        let in_service = highest(&self.isr).map_or(0, |v| u32::from(v) & 0xf0);
        if self.tpr & 0xf0 >= in_service {
            self.tpr
        } else {
            in_service
        }
    }

    fn end_of_interrupt(&mut self) {
        if let Some(vector) = highest(&self.isr) {
            let (word, bit) = bit_of(vector);
            self.isr[word] &= !bit;
        }
    }
}

fn lvt_index(offset: u64) -> usize {
    usize::try_from((offset - REG_LVT_TIMER) >> 4).unwrap_or(0)
}

fn bit_of(vector: u8) -> (usize, u32) {
    (usize::from(vector >> 5), 1 << (vector & 31))
}

fn highest(bits: &[u32; 8]) -> Option<u8> {
    (0..8u8)
        .rev()
        .find(|&w| bits[usize::from(w)] != 0)
        .map(|w| w * 32 + (31 - bits[usize::from(w)].leading_zeros()) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled(id: u8) -> LocalApic {
        let mut apic = LocalApic::new(id);
        apic.write(REG_SVR, 0x1ff, 0);
        apic
    }

    #[test]
    fn id_and_version_read_as_the_sdm_lays_them_out() {
        let apic = LocalApic::new(3);
        assert_eq!(apic.read(REG_ID, 0), 3 << 24);
        assert_eq!(apic.read(REG_VERSION, 0) & 0xff, 0x14);
        assert_eq!(apic.read(REG_LVT_TIMER, 0), LVT_MASKED);
    }

    #[test]
    fn icr_writes_decode_init_startup_and_fixed_ipis() {
        // What Linux and the demo write: INIT assert to APIC 1, then
        // STARTUP with vector 0x10 (code at 0x10000).
        assert_eq!(
            Ipi::decode(0x0000_4500, 1 << 24),
            Some(Ipi {
                kind: IpiKind::Init,
                destination: Destination::Physical(1)
            })
        );
        assert_eq!(Ipi::decode(0x0000_8500, 1 << 24), None, "INIT de-assert");
        assert_eq!(
            Ipi::decode(0x0000_4610, 2 << 24).map(|i| i.kind),
            Some(IpiKind::Startup(0x10))
        );
        assert_eq!(
            Ipi::decode(0x000c_40f0, 0),
            Some(Ipi {
                kind: IpiKind::Fixed(0xf0),
                destination: Destination::AllButSelf
            })
        );
        assert_eq!(
            Ipi::decode(0x0000_0840, 0x0300_0000).map(|i| i.destination),
            Some(Destination::Logical(3))
        );
    }

    #[test]
    fn an_icr_write_sends_to_the_destination_in_icr_high() {
        let mut apic = enabled(0);
        assert_eq!(apic.write(REG_ICR_HIGH, 2 << 24, 0), None);
        let ipi = apic.write(REG_ICR_LOW, 0x4031, 0);
        assert_eq!(
            ipi,
            Some(Ipi {
                kind: IpiKind::Fixed(0x31),
                destination: Destination::Physical(2)
            })
        );
    }

    #[test]
    fn the_highest_vector_above_the_priority_is_taken_first_and_eoi_ends_it() {
        let mut apic = enabled(0);
        apic.accept(0x31);
        apic.accept(0x52);
        assert_eq!(apic.acknowledge(), Some(0x52));
        // 0x31 is below the in-service class 0x50: it waits for the EOI.
        assert_eq!(apic.pending_vector(), None);
        assert_eq!(apic.read(REG_PPR, 0), 0x50);
        apic.write(REG_EOI, 0, 0);
        assert_eq!(apic.acknowledge(), Some(0x31));
        apic.write(REG_EOI, 0, 0);
        assert_eq!(apic.pending_vector(), None);
    }

    #[test]
    fn task_priority_holds_back_lower_classes() {
        let mut apic = enabled(0);
        apic.write(REG_TPR, 0x40, 0);
        apic.accept(0x41);
        assert_eq!(apic.pending_vector(), None);
        apic.accept(0x51);
        assert_eq!(apic.pending_vector(), Some(0x51));
    }

    #[test]
    fn a_software_disabled_apic_holds_interrupts_and_illegal_vectors_are_dropped() {
        let mut apic = LocalApic::new(0);
        apic.accept(0x40);
        assert_eq!(apic.pending_vector(), None);
        apic.write(REG_SVR, 0x1ff, 0);
        apic.accept(3);
        assert_eq!(apic.acknowledge(), Some(0x40));
        assert_eq!(apic.read(REG_ISR + 0x20, 0), 1, "0x40 in ISR word 2");
    }

    #[test]
    fn the_timer_counts_virtual_time_one_shot_and_periodic() {
        let mut apic = enabled(0);
        apic.write(REG_TIMER_DIVIDE, 0xb, 0); // divide by 1
        apic.write(REG_LVT_TIMER, 0x40, 0); // one-shot, vector 0x40
        apic.write(REG_TIMER_INITIAL, 1000, 0); // 1000 ticks of 10 ns
        assert_eq!(apic.next_deadline(), Some(10_000));
        assert_eq!(apic.read(REG_TIMER_CURRENT, 2_500), 750);
        apic.update(9_999);
        assert_eq!(apic.pending_vector(), None);
        apic.update(10_000);
        assert_eq!(apic.acknowledge(), Some(0x40));
        assert_eq!(apic.next_deadline(), None, "one-shot");
        apic.write(REG_EOI, 0, 10_000);

        apic.write(REG_TIMER_DIVIDE, 0x3, 20_000); // divide by 16
        apic.write(REG_LVT_TIMER, LVT_PERIODIC | 0x41, 20_000);
        apic.write(REG_TIMER_INITIAL, 10, 20_000);
        assert_eq!(apic.next_deadline(), Some(21_600));
        apic.update(21_600);
        assert_eq!(apic.next_deadline(), Some(23_200), "periodic");
        assert_eq!(apic.pending_vector(), Some(0x41));
    }

    #[test]
    fn a_periodic_timer_served_late_keeps_its_phase_and_skips_no_burst() {
        let mut apic = enabled(0);
        apic.write(REG_TIMER_DIVIDE, 0xb, 0); // divide by 1
        apic.write(REG_LVT_TIMER, LVT_PERIODIC | 0x40, 0);
        apic.write(REG_TIMER_INITIAL, 100, 0); // a period of 1000 ns
                                               // Served 300 ns late: the next one is still at 2000, not 2300,
                                               // so ten periods take ten periods' time, as the PIT's do.
        apic.update(1_300);
        assert_eq!(apic.next_deadline(), Some(2_000));
        // Served 3.5 periods late: one interrupt, the next on the grid.
        apic.acknowledge();
        apic.write(REG_EOI, 0, 1_300);
        apic.update(5_500);
        assert_eq!(apic.acknowledge(), Some(0x40));
        apic.update(5_500);
        assert_eq!(apic.pending_vector(), None, "no burst");
        assert_eq!(apic.next_deadline(), Some(6_000));
    }

    #[test]
    fn a_masked_timer_counts_but_raises_nothing() {
        let mut apic = enabled(0);
        apic.write(REG_LVT_TIMER, LVT_MASKED | 0x40, 0);
        apic.write(REG_TIMER_INITIAL, 1, 0);
        apic.update(1_000_000);
        assert_eq!(apic.pending_vector(), None);
    }

    #[test]
    fn ipis_reach_the_cpus_their_destination_names() {
        let ids = [(0, 1), (1, 2), (2, 4), (3, 8)];
        assert_eq!(Destination::SelfOnly.targets(2, &ids), [2]);
        assert_eq!(Destination::All.targets(2, &ids), [0, 1, 2, 3]);
        assert_eq!(Destination::AllButSelf.targets(2, &ids), [0, 1, 3]);
        assert_eq!(Destination::Physical(3).targets(0, &ids), [3]);
        assert_eq!(Destination::Physical(0xff).targets(0, &ids), [0, 1, 2, 3]);
        assert!(Destination::Physical(9).targets(0, &ids).is_empty());
        assert_eq!(Destination::Logical(0b1010).targets(0, &ids), [1, 3]);
    }
}
