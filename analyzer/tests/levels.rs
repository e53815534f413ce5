//! The level engine on synthetic step sequences: irregular control flow
//! is marked, counted and survived, and self counts add up.

use vtrace_analyzer::{
    ExitKind, FrameView, Irregular, Item, LevelEngine, LevelSink, NestWriter, DIVIDED,
};
use vtrace_image::symbols::{Scope, Symbol, SymbolTable, Symbolizer};
use vtrace_x86::Flow;

/// Routines `a` at 0x1000, `b` at 0x2000, `c` at 0x3000.
fn symbols() -> Symbolizer {
    let table = SymbolTable::new(
        [(0x1000, "a"), (0x2000, "b"), (0x3000, "c")]
            .iter()
            .map(|(start, name)| Symbol {
                start: *start,
                size: 0x100,
                name: name.to_string(),
            })
            .collect(),
        Some(0x3100),
    );
    let mut s = Symbolizer::new();
    s.add("test", Scope::Any, table, None);
    s
}

/// Builds steps from (pc, flow, length).
fn steps(symbols: &Symbolizer, list: &[(u64, Flow, u8)]) -> Vec<Item> {
    list.iter()
        .enumerate()
        .map(|(i, (pc, flow, len))| Item::Step {
            step: i as u64,
            pc: *pc,
            cr3: 0x1000,
            func: symbols
                .resolve(*pc, 0x1000)
                .map(|r| r.func)
                .unwrap_or(u32::MAX),
            flow: *flow,
            len: *len,
        })
        .collect()
}

#[derive(Default)]
struct Record {
    self_steps: u64,
    irregular: Vec<Irregular>,
    exits: Vec<(String, ExitKind)>,
}

struct Sink<'a>(&'a Symbolizer, Record);

impl LevelSink for Sink<'_> {
    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        self.1.self_steps += frame.self_steps;
        self.1
            .exits
            .push((self.0.name(frame.func).to_string(), how));
    }
    fn irregular(&mut self, _: u64, _: usize, what: Irregular) {
        self.1.irregular.push(what);
    }
}

fn run(list: &[(u64, Flow, u8)]) -> (Record, String) {
    let symbols = symbols();
    let items = steps(&symbols, list);
    let mut engine = LevelEngine::new();
    let mut sink = Sink(&symbols, Record::default());
    for item in &items {
        engine.push(*item, &mut sink);
    }
    engine.finish(&mut sink);
    let mut engine = LevelEngine::new();
    let mut nest = NestWriter::new(Vec::new(), &symbols);
    for item in &items {
        engine.push(*item, &mut nest);
    }
    engine.finish(&mut nest);
    let text = String::from_utf8(nest.finish().unwrap()).unwrap();
    (sink.1, text)
}

#[test]
fn calls_and_returns_nest_and_self_counts_add_up() {
    let list = [
        (0x1000, Flow::Next, 1),
        (0x1001, Flow::Call, 5), // a calls b
        (0x2000, Flow::Next, 1),
        (0x2001, Flow::Call, 5), // b calls c
        (0x3000, Flow::Return, 1),
        (0x2006, Flow::Return, 1),
        (0x1006, Flow::Next, 1),
    ];
    let (r, text) = run(&list);
    assert!(r.irregular.is_empty(), "{:?}", r.irregular);
    assert_eq!(r.self_steps, list.len() as u64);
    assert!(text.contains("a() {"), "{text}");
    assert!(text.contains("  b() {"), "{text}");
    assert!(text.contains("    c();"), "{text}");
    assert!(!text.contains(DIVIDED), "{text}");
}

#[test]
fn ret_used_as_a_call_is_marked_not_fatal() {
    // a pushes c's address and "returns" into it; c returns to a frame
    // that was never called either.
    let list = [
        (0x1000, Flow::Next, 1),
        (0x1001, Flow::Return, 1),
        (0x3000, Flow::Next, 1),
        (0x3001, Flow::Return, 1),
        (0x1010, Flow::Next, 1),
    ];
    let (r, text) = run(&list);
    assert!(matches!(
        r.irregular[..],
        [
            Irregular::ReturnNotOnStack { to: 0x3000 },
            Irregular::ReturnNotOnStack { to: 0x1010 }
        ]
    ));
    assert_eq!(r.self_steps, list.len() as u64);
    assert_eq!(text.matches(DIVIDED).count(), 2, "{text}");
}

#[test]
fn jump_back_into_a_routine_on_the_stack_is_marked_and_unwinds() {
    let list = [
        (0x1000, Flow::Call, 5), // a calls b
        (0x2000, Flow::Call, 5), // b calls c
        (0x3000, Flow::Jump, 2), // c jumps into b's body
        (0x2040, Flow::Return, 1),
        (0x1005, Flow::Next, 1),
    ];
    let (r, text) = run(&list);
    assert_eq!(r.irregular, [Irregular::JumpIntoStack { skipped: 1 }]);
    assert!(r.exits.contains(&("c".to_string(), ExitKind::Unwound)));
    assert!(r.exits.contains(&("b".to_string(), ExitKind::Return)));
    assert_eq!(r.self_steps, list.len() as u64);
    assert!(text.contains(DIVIDED), "{text}");
}

#[test]
fn return_past_frames_and_a_tail_jump() {
    let list = [
        (0x1000, Flow::Call, 5),   // a calls b
        (0x2000, Flow::Jump, 2),   // b tail-jumps to c (not on the stack)
        (0x3000, Flow::Call, 5),   // c calls b
        (0x2000, Flow::Return, 1), // b returns straight to a (longjmp)
        (0x1005, Flow::Next, 1),
    ];
    let (r, text) = run(&list);
    assert_eq!(r.irregular, [Irregular::ReturnPastFrames { skipped: 1 }]);
    assert!(r.exits.contains(&("b".to_string(), ExitKind::JumpedAway)));
    assert!(text.contains("c() {  [jmp]"), "{text}");
    assert_eq!(r.self_steps, list.len() as u64);
}

#[test]
fn an_interrupt_nests_inside_what_it_interrupted_and_returns_to_it() {
    let symbols = symbols();
    let mut items = steps(
        &symbols,
        &[(0x1000, Flow::Call, 5), (0x2000, Flow::Next, 1)],
    );
    items.push(Item::Interrupt { vector: 32 });
    items.extend(
        steps(
            &symbols,
            &[(0x3000, Flow::Next, 1), (0x3001, Flow::InterruptReturn, 2)],
        )
        .into_iter()
        .map(|i| match i {
            Item::Step {
                step,
                pc,
                cr3,
                func,
                flow,
                len,
            } => Item::Step {
                step: step + 2,
                pc,
                cr3,
                func,
                flow,
                len,
            },
            other => other,
        }),
    );
    items.push(Item::Step {
        step: 4,
        pc: 0x2001,
        cr3: 0x1000,
        func: symbols.resolve(0x2001, 0).unwrap().func,
        flow: Flow::Return,
        len: 1,
    });
    items.push(Item::Step {
        step: 5,
        pc: 0x1005,
        cr3: 0x1000,
        func: symbols.resolve(0x1005, 0).unwrap().func,
        flow: Flow::Next,
        len: 1,
    });
    let mut engine = LevelEngine::new();
    let mut nest = NestWriter::new(Vec::new(), &symbols);
    for item in &items {
        engine.push(*item, &mut nest);
    }
    engine.finish(&mut nest);
    assert_eq!(engine.counts.irregular, 0);
    let text = String::from_utf8(nest.finish().unwrap()).unwrap();
    assert!(text.contains("==> interrupt: irq 0 (timer) in b"), "{text}");
    assert!(text.contains("c();  [irq 0 (timer)]"), "{text}");
    assert!(text.contains("==> return from interrupt"), "{text}");
}

/// The nest diagram of `items` with `options`, body lines only (the
/// routine column, indentation kept).
fn nest_with(items: &[Item], options: vtrace_analyzer::NestOptions) -> Vec<String> {
    let symbols = symbols();
    let mut engine = LevelEngine::new();
    let mut nest = NestWriter::with_options(Vec::new(), &symbols, options);
    for item in items {
        engine.push(*item, &mut nest);
    }
    engine.finish(&mut nest);
    let text = String::from_utf8(nest.finish().unwrap()).unwrap();
    text.lines()
        .map(|l| {
            l.get(2 + 10 + 1 + 10 + 1 + 8 + 2..)
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// a calls b (which calls c) and c, an interrupt (handler c) lands in the
/// first b, and each routine returns RAX = its address's page.
fn calls_with_an_interrupt() -> Vec<Item> {
    let symbols = symbols();
    let mut items = steps(
        &symbols,
        &[
            (0x1000, Flow::Call, 5),            // 0: a calls b
            (0x2000, Flow::Call, 5),            // 1: b calls c
            (0x3000, Flow::Return, 1),          // 2: c returns
            (0x2005, Flow::Next, 1),            // 3: (the interrupt comes after it)
            (0x3010, Flow::InterruptReturn, 2), // 4: the handler, in c
            (0x2006, Flow::Return, 1),          // 5: b returns
            (0x1005, Flow::Call, 5),            // 6: a calls c
            (0x3000, Flow::Return, 1),          // 7: c returns
            (0x100a, Flow::Next, 1),            // 8
        ],
    );
    // RAX before each ret (the builder puts it there from the records).
    for (at, value) in [(7, 0x3), (5, 0x2), (2, 0xffff_ffff_ffff_ffea)] {
        items.insert(at, Item::ReturnValue(value));
    }
    let interrupt = items
        .iter()
        .position(|i| matches!(i, Item::Step { step: 4, .. }))
        .unwrap();
    items.insert(interrupt, Item::Interrupt { vector: 32 });
    items
}

#[test]
fn excluded_routines_go_with_all_they_call_and_their_interrupts() {
    let items = calls_with_an_interrupt();
    let all = nest_with(&items, Default::default());
    assert!(all.iter().any(|l| l.contains("==> interrupt")), "{all:#?}");
    let options = vtrace_analyzer::NestOptions {
        exclude: vtrace_analyzer::RoutineFilter::new(&["b".into()], false).unwrap(),
        ..Default::default()
    };
    let lines = nest_with(&items, options);
    // b, the c it called and the interrupt taken in it are gone; a's
    // counts still hold b's steps, and a's own call of c stays.
    let body: Vec<&str> = lines.iter().map(|l| l.trim_end()).collect();
    assert_eq!(
        body,
        [
            "==> trace start (address space 0x1000)",
            "a() {",
            "  c();",
            "} /* a, open at trace end */"
        ],
        "{lines:#?}"
    );
}

#[test]
fn short_calls_drop_with_their_callees_and_return_values_show_as_ftrace_s() {
    let items = calls_with_an_interrupt();
    let options = vtrace_analyzer::NestOptions {
        retval: true,
        ..Default::default()
    };
    let lines = nest_with(&items, options);
    let text = lines.join("\n");
    // An error number in decimal, other values in hex; an interrupt's
    // handler returns nothing.
    assert!(text.contains("  c(); /* = -22 */"), "{text}");
    assert!(text.contains("} /* b = 0x2 */"), "{text}");
    assert!(text.contains("  c(); /* = 0x3 */"), "{text}");
    assert!(text.contains("c();  [irq 0 (timer)]"), "{text}");
    assert!(!text.contains("[irq 0 (timer)] /*"), "{text}");

    // Calls of fewer than 2 steps go: both calls of c (1 step each) and
    // the handler; b (5 steps with the interrupt) stays.
    let options = vtrace_analyzer::NestOptions {
        min_steps: Some(2),
        ..Default::default()
    };
    let lines = nest_with(&items, options);
    assert!(!lines.iter().any(|l| l.contains("c()")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("b() {")), "{lines:#?}");
}
