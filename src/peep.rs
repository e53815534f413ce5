//! `vtrace run --peep`'s summary line.

use vtrace_session::PeepSetup;
use vtrace_trap::SampleCount;
use vtrace_vmm::PeepReport;

/// The run summary's line.
pub fn summary(setup: &PeepSetup, peeped: Option<PeepReport>, written: SampleCount) -> String {
    let mut what: Vec<&str> = setup.variables.iter().map(|v| v.name.as_str()).collect();
    if setup.plan.pc {
        what.push("the pc (an exit each)");
    }
    let mut line = format!(
        "vtrace: peeped at {} every {}: {} in the trace",
        what.join(", "),
        setup.interval,
        counted(written.recorded, "sample")
    );
    if let Some(r) = peeped.filter(|r| r.missed > 0) {
        line.push_str(&format!(
            ", {} missed (the host was late)",
            counted(r.missed, "interval")
        ));
    }
    if written.lost > 0 {
        line.push_str(&format!(", {} lost: the trace disk was full", written.lost));
    }
    line
}

/// "1 sample", "2 samples".
fn counted(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}
