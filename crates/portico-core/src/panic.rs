//! Where the last panic on a worker thread was raised, and what it said: panics are caught where they happen
//! (a request, a connection) and logged once there, with their context.

use std::cell::RefCell;

thread_local! {
    /// Where the last panic on this thread was raised, for the one log line that reports it.
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics on worker threads are caught and logged once, with their request's context, where they are caught;
/// this hook only notes where they were raised. Other threads keep the default report.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let on_worker = std::thread::current().name().is_some_and(|n| n.starts_with("portico-worker-"));
        if on_worker {
            let location = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_LOCATION.with(|p| *p.borrow_mut() = location);
        } else {
            default(info);
        }
    }));
}

/// Where the last panic on this thread was raised (taken).
pub fn last_panic_location() -> String {
    PANIC_LOCATION.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "unknown location".into())
}

/// The text a panic was raised with, if it has one.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
