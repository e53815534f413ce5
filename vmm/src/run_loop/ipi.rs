//! The IPIs one CPU sends the others through its local APIC, and the
//! STARTUP that brings one to life.

use crate::cpu::entry::{self, EntryState};
use crate::devices::lapic::{Ipi, IpiKind};
use crate::error::Result;

use super::Run;
use crate::cpus::Power;

impl Run<'_> {
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
                        // Where the engine holds the CPUs, it starts there.
                        if let Some(engine) = self.vm.engine.as_mut().filter(|e| e.holds()) {
                            engine.take_over(target, vcpu)?;
                        }
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
