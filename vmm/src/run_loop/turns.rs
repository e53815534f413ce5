//! A machine of several CPUs: whose turn comes after each exit (see
//! `crate::cpus`), the IPIs one CPU sends the others through its local
//! APIC, and the STARTUP that brings one to life.

use crate::cpu::entry::{self, EntryState};
use crate::cpus::{self, Power, Turn};
use crate::devices::lapic::{Ipi, IpiKind};
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

    /// Delivers an IPI from the on-stage CPU.
    pub(super) fn send_ipi(&mut self, ipi: Ipi) -> Result<()> {
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
