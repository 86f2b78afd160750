//! hyper's executor on a worker's thread: what hyper spawns (HTTP/2 streams, connection tasks) runs as a
//! local task of the worker, like the connections themselves.

/// Runs hyper's executor contract on the worker's thread: streams are local tasks, like connections.
#[derive(Clone, Copy)]
pub(crate) struct LocalExec;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}
