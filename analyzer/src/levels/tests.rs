//! The engine fed by the item builder, on made-up routines.

use super::items::ItemBuilder;
use super::*;
use crate::input::SegmentInfo;
use crate::insn::InsnCache;
use vtrace_image::symbols::{Scope, Symbol, SymbolTable, Symbolizer, UNKNOWN_FUNC};
use vtrace_storage::{CpuMode, Event, InsnBytes, Record, Regs, Step, TraceReason};
use vtrace_x86::Flow;

/// Routines of 0x100 bytes at the given addresses.
fn routines(list: &[(u64, &str)]) -> Symbolizer {
    let end = list.iter().map(|(start, _)| start + 0x100).max();
    let table = SymbolTable::new(
        list.iter()
            .map(|(start, name)| Symbol {
                start: *start,
                size: 0x100,
                name: name.to_string(),
            })
            .collect(),
        end,
    );
    let mut s = Symbolizer::new();
    s.add("test", Scope::Any, table, None);
    s
}

fn symbols() -> Symbolizer {
    routines(&[(0x1000, "a"), (0x2000, "b"), (0x3000, "c")])
}

fn step(pc: u64, bytes: &[u8]) -> Record {
    Record::Step(Step {
        pc,
        bytes: InsnBytes::new(bytes).expect("test bytes"),
        cr3: 0x1000,
        mode: CpuMode::Long64,
        cpl: 0,
        regs: Regs::default(),
    })
}

const NOP: &[u8] = &[0x90];

/// Straight runs, a jump within a routine, a call, a tail jump, a
/// return, an interrupt and its return, a mark, and tracing stopped
/// and started again.
fn records() -> Vec<Record> {
    vec![
        step(0x1000, NOP),
        step(0x1001, NOP),
        step(0x1002, &[0xeb, 0x00]),             // jmp 0x1004
        step(0x1004, &[0xe8, 0xf7, 0x0f, 0, 0]), // call 0x2000
        step(0x2000, NOP),
        step(0x2001, NOP),
        step(0x2002, &[0xe9, 0xf9, 0x0f, 0, 0]), // jmp 0x3000
        step(0x3000, NOP),
        step(0x3001, &[0xc3]), // ret to 0x1009
        step(0x1009, NOP),
        Record::Event(Event::Interrupt {
            vector: 32,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        }),
        step(0x2010, NOP),
        step(0x2011, NOP),
        step(0x2012, &[0x48, 0xcf]), // iretq to 0x100a
        step(0x100a, NOP),
        Record::Event(Event::Mark { id: 1, value: 2 }),
        step(0x100b, NOP),
        step(0x100c, NOP),
        Record::Event(Event::TraceStop(TraceReason::Hotkey)),
        Record::Event(Event::TraceStart(TraceReason::Hotkey)),
        step(0x100d, NOP),
        step(0x100e, NOP),
    ]
}

/// Every callback, in order, as text.
#[derive(Default)]
struct Log(Vec<String>);

impl LevelSink for Log {
    fn big_level(&mut self, level: &BigLevel) {
        self.0.push(format!("{level:?}"));
    }
    fn enter(&mut self, frame: &FrameView) {
        self.0.push(format!("enter {frame:?}"));
    }
    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        self.0.push(format!("exit {frame:?} {how:?}"));
    }
    fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
        self.0.push(format!("irregular {step} {depth} {what:?}"));
    }
    fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
        self.0.push(format!("mark {step} {cr3} {id} {value}"));
    }
}

fn feed(items: &[Item]) -> (Vec<String>, LevelCounts) {
    let mut engine = LevelEngine::new();
    let mut log = Log::default();
    for item in items {
        engine.push(*item, &mut log);
    }
    engine.finish(&mut log);
    (log.0, engine.counts)
}

/// The items of `records` as one segment from step 0.
fn items(symbols: &Symbolizer, records: &[Record]) -> Vec<Item> {
    segment_items(symbols, 0, records)
}

/// The items of `records` as one segment whose first step is `first_step`.
fn segment_items(symbols: &Symbolizer, first_step: u64, records: &[Record]) -> Vec<Item> {
    let info = SegmentInfo {
        index: 0,
        first_step,
        steps: 0,
    };
    let mut cache = InsnCache::default();
    let mut builder = ItemBuilder::new(&info, symbols);
    for r in records {
        builder.record(SegmentRecord::new(r.borrowed(), &mut cache));
    }
    builder.finish()
}

/// Entries and exits by name (with the task's id where named and the
/// self steps), irregularities and task switches, as text.
struct Calls<'a>(&'a Symbolizer, Vec<String>);

impl LevelSink for Calls<'_> {
    fn big_level(&mut self, level: &BigLevel) {
        if let BigLevelCause::TaskSwitch { from } = level.cause {
            let to = level.task.map(|t| t.to_string());
            let from = from.map(|t| t.to_string());
            self.1.push(format!("switch to {to:?} from {from:?}"));
        }
    }
    fn enter(&mut self, f: &FrameView) {
        let tid = f.task.map(|t| format!(" {}", t.tid)).unwrap_or_default();
        self.1.push(format!("enter {}{tid}", self.0.name(f.func)));
    }
    fn exit(&mut self, f: &FrameView, how: ExitKind) {
        let tid = f.task.map(|t| format!(" {}", t.tid)).unwrap_or_default();
        let name = self.0.name(f.func);
        self.1
            .push(format!("exit {name}{tid} {} {how:?}", f.self_steps));
    }
    fn irregular(&mut self, _: u64, _: usize, what: Irregular) {
        self.1.push(format!("{what:?}"));
    }
}

/// Runs the engine over `items`; what [`Calls`] saw, and the counts.
fn calls(symbols: &Symbolizer, items: Vec<Item>) -> (Vec<String>, LevelCounts) {
    let mut engine = LevelEngine::new();
    let mut calls = Calls(symbols, Vec::new());
    for item in items {
        engine.push(item, &mut calls);
    }
    engine.finish(&mut calls);
    (calls.1, engine.counts)
}

#[test]
fn calls_through_retpolines_and_return_thunks_nest_like_direct_ones() {
    let symbols = routines(&[
        (0x1000, "a"),
        (0x2000, "b"),
        (0x4000, "__x86_return_thunk"),
        (0x5000, "__x86_indirect_thunk_array"),
    ]);
    let records = [
        step(0x1000, &[0xe8, 0xfb, 0x3f, 0, 0]), // call __x86_indirect_thunk_array
        step(0x5000, &[0xe8, 0x07, 0, 0, 0]),    // call +0xc (the retpoline)
        step(0x500c, &[0x48, 0x89, 0x04, 0x24]), // mov [rsp], rax
        step(0x5010, &[0xe9, 0xeb, 0xef, 0xff, 0xff]), // jmp __x86_return_thunk
        step(0x4000, &[0xc3]),                   // ret: into b
        step(0x2000, NOP),
        step(0x2001, &[0xe9, 0xfa, 0x1f, 0, 0]), // jmp __x86_return_thunk
        step(0x4000, &[0xc3]),                   // ret: back to a
        step(0x1005, NOP),
    ];
    let (calls, counts) = calls(&symbols, items(&symbols, &records));
    assert_eq!(
        calls,
        [
            "enter a",
            "enter b",
            // The retpoline's four steps, b's two and the return
            // thunk's ret.
            "exit b 7 Return",
            "exit a 2 TraceEnd",
        ]
    );
    assert_eq!(counts.irregular, 0);
}

/// Linux's SRSO return thunk (arch/x86/lib/retpoline.S): `jmp
/// srso_return_thunk`, which is `call srso_safe_ret`, which is `lea
/// 8(%rsp), %rsp; ret`: one return, as if `ret` were in place of the jmp.
#[test]
fn an_srso_return_thunk_is_one_return() {
    let symbols = routines(&[
        (0x1000, "a"),
        (0x2000, "b"),
        (0x4000, "srso_return_thunk"),
        (0x6000, "srso_safe_ret"),
    ]);
    let records = [
        step(0x1000, &[0xe8, 0xfb, 0x0f, 0, 0]), // call b
        step(0x2000, NOP),
        step(0x2001, &[0xe9, 0xfa, 0x1f, 0, 0]), // jmp srso_return_thunk
        step(0x4000, &[0xe8, 0xfb, 0x1f, 0, 0]), // call srso_safe_ret
        step(0x6000, &[0x48, 0x8d, 0x64, 0x24, 0x08]), // lea rsp, [rsp+8]
        step(0x6005, &[0xc3]),                   // ret: back to a
        step(0x1005, NOP),
    ];
    let (whole, counts) = calls(&symbols, items(&symbols, &records));
    assert_eq!(
        whole,
        ["enter a", "enter b", "exit b 5 Return", "exit a 2 TraceEnd"]
    );
    assert_eq!(counts.irregular, 0);

    // A segment that starts inside the thunk cannot see who jumped there;
    // the engine, in order, can.
    for cut in 3..6 {
        let mut both = items(&symbols, &records[..cut]);
        both.extend(segment_items(&symbols, cut as u64, &records[cut..]));
        let (split, counts) = calls(&symbols, both);
        assert_eq!(split, whole, "cut before step {cut}");
        assert_eq!(counts.irregular, 0);
    }
}

/// RAX after a `ret` is what the routine it leaves returned, whether the
/// `ret` ends a run or an interrupt comes between it and where it lands;
/// the frames a `ret` unwinds past returned nothing.
#[test]
fn a_return_carries_rax_after_its_ret_to_the_routine_it_leaves() {
    let symbols = symbols();
    let with_rax = |pc, bytes: &[u8], rax| match step(pc, bytes) {
        Record::Step(mut s) => {
            s.regs.gpr[0] = rax;
            Record::Step(s)
        }
        other => other,
    };
    let records = vec![
        step(0x1000, &[0xe8, 0xfb, 0x0f, 0, 0]), // call 0x2000
        step(0x2000, NOP),
        with_rax(0x2001, &[0xc3], 42), // ret to 0x1005, after a run
        step(0x1005, &[0xe8, 0xf6, 0x1f, 0, 0]), // call 0x3000
        with_rax(0x3000, &[0xc3], 0xffff_ffff_ffff_ffea), // ret to 0x100a
        Record::Event(Event::Interrupt {
            vector: 32,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        }),
        step(0x2010, &[0x48, 0xcf]), // iretq to 0x100a
        step(0x100a, NOP),
    ];
    let (log, counts) = feed(&items(&symbols, &records));
    let exits = |kind: &str| -> Vec<&String> {
        log.iter()
            .filter(|l| l.starts_with("exit") && l.contains(kind))
            .collect()
    };
    let calls = exits("kind: Call");
    assert_eq!(calls.len(), 2, "{log:#?}");
    assert!(calls[0].contains("func: 1,") && calls[0].contains("return_value: Some(42)"));
    assert!(
        calls[1].contains("func: 2,")
            && calls[1].contains("return_value: Some(18446744073709551594)"),
        "{log:#?}"
    );
    // The interrupt's frame, left by iretq, returned no value.
    let interrupt = exits("kind: Interrupt");
    assert!(
        interrupt.len() == 1 && interrupt[0].contains("return_value: None"),
        "{log:#?}"
    );
    assert_eq!(counts.irregular, 0);
}

#[test]
fn folded_runs_change_nothing_the_sinks_see() {
    let symbols = symbols();
    let folded = segment_items(&symbols, 100, &records());

    // The same records, one item per step, built independently.
    let mut plain = Vec::new();
    let mut cache = InsnCache::default();
    let mut number = 100;
    let mut restarted = false;
    for r in records() {
        match r {
            Record::Step(s) => {
                if std::mem::take(&mut restarted) {
                    plain.push(Item::Restart);
                }
                if cache.get(&s).flow == Flow::Return {
                    plain.push(Item::ReturnValue(s.regs.gpr[0]));
                }
                plain.push(Item::Step {
                    step: number,
                    pc: s.pc,
                    cr3: s.cr3,
                    func: symbols
                        .resolve(s.pc, s.cr3)
                        .map_or(UNKNOWN_FUNC, |r| r.func),
                    flow: cache.get(&s).flow,
                    len: s.bytes.len() as u8,
                });
                number += 1;
            }
            Record::Event(Event::Interrupt { vector, .. }) => {
                plain.push(Item::Interrupt { vector })
            }
            Record::Event(Event::Mark { id, value }) => plain.push(Item::Mark { id, value }),
            Record::Event(Event::TraceStart(_)) => restarted = true,
            Record::Event(_) => {}
        }
    }

    let runs = folded
        .iter()
        .filter(|i| matches!(i, Item::Run { .. }))
        .count();
    assert!(runs >= 4, "straight code is folded: {folded:?}");
    assert!(folded.len() < plain.len());
    let (folded_log, folded_counts) = feed(&folded);
    let (plain_log, plain_counts) = feed(&plain);
    assert_eq!(folded_log, plain_log);
    assert_eq!(folded_counts, plain_counts);
    assert_eq!(plain_counts.steps, 18);
    assert_eq!(plain_counts.calls, 1);
    assert_eq!(plain_counts.interrupts, 1);
    assert_eq!(plain_counts.breaks, 1);
}

#[test]
fn each_task_has_its_own_stack_and_a_switch_back_returns_into_it() {
    let symbols = routines(&[
        (0x1000, "schedule"),
        (0x2000, "__switch_to_asm"),
        (0x3000, "__switch_to"),
    ]);
    let task = |tid: u32, comm: &str| {
        Record::Event(Event::Task {
            tid,
            pid: tid,
            comm: comm.into(),
        })
    };
    // Two tasks in one address space (kernel threads borrow one) switch
    // as Linux does: `__switch_to_asm` changes stacks and jumps to
    // `__switch_to`, where the trace names the next task, which then
    // returns into its own `schedule`.
    let records = [
        task(1, "a"),
        step(0x1000, &[0xe8, 0xfb, 0x0f, 0, 0]), // call __switch_to_asm
        step(0x2000, NOP),
        step(0x2001, &[0xe9, 0xfa, 0x0f, 0, 0]), // jmp __switch_to
        task(2, "b"),
        step(0x3000, NOP),
        step(0x3001, &[0xc3]), // b's first return: its first run's start
        step(0x1005, NOP),
        step(0x1006, &[0xe8, 0xf5, 0x0f, 0, 0]), // call __switch_to_asm
        step(0x2000, NOP),
        step(0x2001, &[0xe9, 0xfa, 0x0f, 0, 0]), // jmp __switch_to
        task(1, "a"),
        step(0x3000, NOP),
        step(0x3001, &[0xc3]), // back into a's schedule
        step(0x1005, NOP),
    ];
    let (calls, counts) = calls(&symbols, items(&symbols, &records));
    assert_eq!(
        calls,
        [
            "enter schedule 1",
            "enter __switch_to_asm 1",
            "switch to Some(\"b-2\") from Some(\"a-1\")",
            "enter __switch_to 2",
            "exit __switch_to 2 2 JumpedAway",
            "enter schedule 2",
            "enter __switch_to_asm 2",
            "switch to Some(\"a-1\") from Some(\"b-2\")",
            "exit __switch_to_asm 1 2 JumpedAway",
            "enter __switch_to 1",
            "exit __switch_to 1 2 Return",
            "exit schedule 1 2 TraceEnd",
            "exit __switch_to_asm 2 2 TraceEnd",
            "exit schedule 2 2 TraceEnd",
        ]
    );
    assert_eq!(counts.switches, 2);
    // b's first return goes where b was never seen to call from: how a
    // task's first run begins, not irregular flow.
    assert_eq!(counts.irregular, 0);
}

/// A `sysret` returns from the system call the `syscall` before it
/// entered, an `iretq` from the interrupt: the big levels say which.
#[test]
fn returns_from_system_calls_and_interrupts_are_told_apart() {
    struct Resumes(Vec<bool>);
    impl LevelSink for Resumes {
        fn big_level(&mut self, level: &BigLevel) {
            if let BigLevelCause::Resume { system_call } = level.cause {
                self.0.push(system_call);
            }
        }
    }
    let symbols = symbols();
    let records = [
        step(0x1000, NOP),
        step(0x1001, &[0x0f, 0x05]), // syscall
        step(0x2000, NOP),
        step(0x2001, &[0x48, 0x0f, 0x07]), // sysretq to 0x1003
        step(0x1003, NOP),
        Record::Event(Event::Interrupt {
            vector: 32,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        }),
        step(0x3000, NOP),
        step(0x3001, &[0x48, 0xcf]), // iretq to 0x1004
        step(0x1004, NOP),
    ];
    let mut engine = LevelEngine::new();
    let mut sink = Resumes(Vec::new());
    for item in items(&symbols, &records) {
        engine.push(item, &mut sink);
    }
    engine.finish(&mut sink);
    assert_eq!(sink.0, [true, false]);
}

/// `int 0x80` from user mode is a system call through the i386 table,
/// whether or not the host recorded its vector's delivery: its level is
/// the system call's, named from that table, and the `iretq` returns
/// from a system call. An `int3` stays an interrupt.
#[test]
fn an_int_0x80_whose_delivery_was_recorded_is_a_system_call() {
    struct Levels(Vec<String>);
    impl LevelSink for Levels {
        fn big_level(&mut self, level: &BigLevel) {
            self.0.push(match level.cause {
                BigLevelCause::SystemCall { call } => format!("{:?}", call.map(|c| c.to_string())),
                other => format!("{other:?}"),
            });
        }
    }
    let user = |pc: u64, bytes: &[u8], rax: u64| {
        let mut regs = Regs::default();
        regs.gpr[0] = rax;
        Record::Step(Step {
            pc,
            bytes: InsnBytes::new(bytes).expect("test bytes"),
            cr3: 0x1000,
            mode: CpuMode::Long64,
            cpl: 3,
            regs,
        })
    };
    let delivered = |vector| {
        Record::Event(Event::Interrupt {
            vector,
            error_code: None,
            source: vtrace_storage::InterruptSource::ReportedByKvm,
        })
    };
    let symbols = symbols();
    let records = [
        user(0x1000, NOP, 20),
        user(0x1001, &[0xcd, 0x80], 20), // int 0x80
        delivered(0x80),
        step(0x2000, NOP),
        step(0x2001, &[0x48, 0xcf]), // iretq to 0x1003
        user(0x1003, &[0xcc], 0),    // int3
        delivered(3),
        step(0x3000, NOP),
        step(0x3001, &[0x48, 0xcf]), // iretq to 0x1004
        user(0x1004, NOP, 0),
    ];
    let mut engine = LevelEngine::new();
    let mut sink = Levels(Vec::new());
    for item in items(&symbols, &records) {
        engine.push(item, &mut sink);
    }
    engine.finish(&mut sink);
    assert_eq!(
        sink.0[1..],
        [
            "Some(\"getpid (ia32 20)\")",
            "Resume { system_call: true }",
            "Interrupt { vector: 3 }",
            "Resume { system_call: false }",
        ]
    );
}
