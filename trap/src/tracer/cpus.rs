//! A machine of several CPUs: an engine per CPU, since each CPU has its own
//! instruction about to run, registers and interrupt in flight. The engine
//! of the CPU the VMM enters is `Tracer::engine`, as on one CPU; the
//! others wait in `parked_engines` and trade places on the VMM's turns;
//! so does what the task watch knows of the task each CPU runs.
//! The records name the CPU they ran on with `Event::Cpu`.

use vtrace_storage::Event;

use crate::engine::{Engine, EngineStats};

use super::Tracer;

impl Tracer {
    /// An engine as this tracer's options want it. Boxed: the CPUs'
    /// engines trade places at every turn, and moving a pointer costs
    /// less than moving an engine (about 1 KB, moved three times a swap).
    pub(super) fn new_engine(&self) -> Box<Engine> {
        let mut engine = Box::new(Engine::new());
        engine.set_step_limit(self.options.max_steps);
        engine.set_record_values(self.options.record_values);
        // Needed where stepping rides on TF (the CPU would run handlers
        // unstepped); done on every host so that the same guest gives the
        // same records everywhere. Its cost here is within noise. The
        // engine runs no TF (see `Tracer::on_engine`).
        engine.set_foresee_faults(self.on_trap_flag);
        engine
    }

    /// The CPU on stage, as the trace numbers it.
    pub(super) fn cpu_number(&self) -> u32 {
        u32::try_from(self.cpu).unwrap_or(u32::MAX)
    }

    /// The VMM turned to CPU `cpu`: its engine goes on stage, and while
    /// tracing, the records that follow say they are that CPU's.
    pub(super) fn turn_to(&mut self, cpu: usize) {
        if cpu == self.cpu {
            return;
        }
        let needed = cpu.max(self.cpu) + 1;
        while self.parked_engines.len() < needed {
            let engine = self.new_engine();
            self.parked_engines.push(engine);
        }
        // The slot of the CPU on stage holds a spare engine: it takes
        // the engine that leaves, and the one that comes leaves the spare
        // in its own slot.
        std::mem::swap(&mut self.engine, &mut self.parked_engines[self.cpu]);
        std::mem::swap(&mut self.engine, &mut self.parked_engines[cpu]);
        self.cpu = cpu;
        if let Some(tasks) = &mut self.tasks {
            tasks.turn_to(cpu);
        }
        self.windows.turn_to(self.cpu_number());
        self.engine.start_turn();
        // A window's records are all its CPU's, which its start names.
        if self.active && !self.windows.is_open() {
            self.recorder.event(&Event::Cpu(self.cpu_number()));
        }
    }

    /// The steps come from stepping with TF (`on`) or from the engine
    /// ([`vtrace_vmm::Monitor::on_engine`]): every CPU's engine hears it.
    pub(super) fn set_trap_flag(&mut self, on: bool) {
        self.on_trap_flag = on;
        self.engine.set_foresee_faults(on);
        for engine in &mut self.parked_engines {
            engine.set_foresee_faults(on);
        }
    }

    /// Every CPU's engine's counts, added up.
    pub(super) fn engine_stats(&self) -> EngineStats {
        let mut total = self.engine.stats();
        for (cpu, engine) in self.parked_engines.iter().enumerate() {
            if cpu != self.cpu {
                total += engine.stats();
            }
        }
        total
    }

    /// Tracing stopped: every CPU's engine lets go of its CPU.
    pub(super) fn end_engines(&mut self) {
        self.engine.end();
        for engine in &mut self.parked_engines {
            engine.end();
        }
    }
}
