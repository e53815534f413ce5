//! A machine of several CPUs: whose turn comes after each exit (see
//! `crate::cpus`), the local APIC page each CPU reads and writes, the IPIs
//! one CPU sends the others, and the STARTUP that brings one to life.

use crate::cpu::entry::{self, EntryState};
use crate::cpus::{self, Power, Turn};
use crate::devices::lapic::{self, Ipi, IpiKind};
use crate::error::Result;

use super::Run;

impl Run<'_> {
    /// After an exit: the next CPU in turn goes on stage (a halted one
    /// only where an interrupt waits for it).
    pub(super) fn next_turn(&mut self) {
        let machine = &mut self.vm.machine;
        let devices = &machine.devices;
        let current = machine.cpus.on_stage();
        let turn = cpus::next_turn(
            machine.cpus.power(),
            |cpu| devices.pending_vector(cpu).is_some(),
            current,
        );
        let Turn::Cpu(cpu) = turn else { return };
        if machine.cpus.power()[cpu] == Power::Halted {
            machine.cpus.set_power(cpu, Power::Running);
        }
        if machine
            .cpus
            .bring_on(cpu, &mut machine.vcpu, &mut self.vm.step)
        {
            let immediate_exit = &mut machine.vcpu.run_page().immediate_exit as *mut u8;
            self.kicker.retarget(immediate_exit);
            self.monitor.on_cpu(cpu);
        }
    }

    /// Whether the on-stage CPU's turn ends after this exit: where the
    /// monitor lets it, or where the CPU cannot run on.
    pub(super) fn turn_ends(&self) -> bool {
        let cpus = &self.vm.machine.cpus;
        cpus.power()[cpus.on_stage()] != Power::Running || self.monitor.turn_may_end()
    }

    /// Whether the on-stage CPU's local APIC answers at `addr`.
    pub(super) fn is_local_apic(&self, addr: u64) -> bool {
        !self.vm.machine.devices.lapics.is_empty()
            && (lapic::BASE..lapic::BASE + lapic::SIZE).contains(&addr)
    }

    /// A read of the on-stage CPU's local APIC: the value, which also goes
    /// to the guest on the next entry.
    pub(super) fn local_apic_read(&mut self, addr: u64, size: u8) -> u64 {
        let machine = &mut self.vm.machine;
        let cpu = machine.cpus.on_stage();
        let now = machine.clock.now();
        let value = machine
            .devices
            .lapics
            .get(cpu)
            .map_or(0, |apic| apic.read(addr - lapic::BASE, now));
        let bytes = value.to_le_bytes();
        machine
            .vcpu
            .complete_mmio_read(&bytes[..usize::from(size).min(bytes.len())]);
        u64::from(value)
    }

    /// A write to the on-stage CPU's local APIC, and the IPI it sends.
    pub(super) fn local_apic_write(&mut self, addr: u64, value: u64) -> Result<()> {
        let machine = &mut self.vm.machine;
        let cpu = machine.cpus.on_stage();
        let now = machine.clock.now();
        // Registers are 32 bits wide, on 16-byte boundaries.
        let value = u32::try_from(value & 0xffff_ffff).unwrap_or(0);
        let ipi = machine
            .devices
            .lapics
            .get_mut(cpu)
            .and_then(|apic| apic.write(addr - lapic::BASE, value, now));
        match ipi {
            Some(ipi) => self.send_ipi(ipi),
            None => Ok(()),
        }
    }

    /// Delivers an IPI from the on-stage CPU.
    fn send_ipi(&mut self, ipi: Ipi) -> Result<()> {
        let machine = &mut self.vm.machine;
        let sender = machine.cpus.on_stage();
        let ids = machine.devices.apic_ids();
        tracing::debug!("CPU {sender} sends {ipi:?}");
        for target in ipi.destination.targets(sender, &ids) {
            let power = machine.cpus.power()[target];
            match ipi.kind {
                IpiKind::Fixed(vector) => {
                    if let Some(apic) = machine.devices.lapics.get_mut(target) {
                        apic.accept(vector);
                    }
                }
                // A CPU cannot INIT itself out from under the loop serving it.
                IpiKind::Init if target != sender => {
                    machine.cpus.set_power(target, Power::WaitingForStartup)
                }
                IpiKind::Startup(vector) if power == Power::WaitingForStartup => {
                    if let Some(vcpu) = machine.cpus.parked_vcpu(target) {
                        entry::apply(vcpu, &machine.ram, EntryState::Startup { vector })?;
                        machine.cpus.set_power(target, Power::Running);
                    }
                }
                IpiKind::Nmi => {
                    tracing::warn!("CPU {sender} sent an NMI, which vtrace does not deliver")
                }
                IpiKind::Init | IpiKind::Startup(_) => {}
            }
        }
        Ok(())
    }
}
