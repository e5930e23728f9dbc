//! Intake: from a TCP connection to a command stored in the queue. [`listen`] holds the
//! connections, [`body`] reads webhook bodies under a memory budget, [`http`] verifies the
//! signature and answers, [`event`] reads the delivery into a typed request, and [`proxy`]
//! takes deliveries from a relay instead (`WEBHOOK_PROXY_URL`), its event stream read by
//! [`sse`] under a bound; [`write_timeout`] drops a peer that reads nothing. Nothing here waits on GitHub, a container or a model.

pub(crate) mod body;
pub(crate) mod event;
pub(crate) mod http;
pub mod listen;
pub(crate) mod proxy;
pub(crate) mod sse;
pub(crate) mod write_timeout;
