//! Portico's HTTP/2 server side (RFC 9113, HPACK RFC 7541), written for Portico rather than taken from the `h2`
//! crate: `h2` is correct, but measured by callgrind it spent about 21,000 instructions per proxied request
//! (its shared stream store behind a lock, its send queues and per-stream bookkeeping), more than nginx's whole
//! request. Here a connection and all its streams live on one task: stream handles share the connection's
//! state through an `Rc<RefCell<_>>`, what streams answer is encoded straight into the connection's write
//! buffer, and one write carries what one wake-up produced. The client side (Portico to `protocol: h2`
//! upstreams) still uses `h2`.

mod conn;
mod frame;
pub mod hpack;
mod huffman;
mod request;

pub use conn::{Error, RecvStream, SendResponse, SendStream, Server, Settings, PREFACE};
pub use frame::Reason;
pub use request::RequestHead;
