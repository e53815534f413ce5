//! The hook through which a tracer observes and steers the VM. The VMM calls
//! it at the points a tracer needs and otherwise knows nothing of tracing.

use crate::devices::hypercall::Hypercall;

/// Observer of a running VM. Every method has a default that does nothing,
/// so [`NoMonitor`] is the VM without a tracer.
pub trait Monitor {
    /// A hypercall the VMM does not serve itself (the tracing commands).
    /// Returns the status for the guest, or `None` if not handled.
    fn hypercall(&mut self, _call: &Hypercall) -> Option<i32> {
        None
    }

    /// A console hotkey other than the VMM's own (`x`, `h`). Returns a line
    /// to show the user, or `None` if the key means nothing to the monitor.
    fn hotkey(&mut self, _key: u8) -> Option<String> {
        None
    }

    /// Lines for the console help (`Ctrl-A h`), as `(key, meaning)`.
    fn hotkey_help(&self) -> Vec<(char, &'static str)> {
        Vec::new()
    }
}

/// The VM with nothing attached.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMonitor;

impl Monitor for NoMonitor {}
