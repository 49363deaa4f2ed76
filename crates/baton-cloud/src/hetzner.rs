//! Hetzner Cloud: the API's objects ([`model`]); the client speaks it through the same
//! machinery as Cherry's (rate gate, IP store, fence, read-back), see [`crate::CherryClient`].

pub mod model;
