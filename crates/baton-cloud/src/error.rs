//! Typed cloud errors: each names the operation, the object and what the API said.

use std::fmt;
use std::time::Duration;

/// A cloud operation, named in errors, logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `GET /v1/projects/{id}`.
    GetProject,
    /// `PUT /v1/projects/{id} {"bgp":true}`.
    EnableProjectBgp,
    /// `GET /v1/servers/{id}`.
    GetServer,
    /// `GET /v1/projects/{id}/servers`.
    ListServers,
    /// `PUT /v1/servers/{id} {"bgp":..}`.
    UpdateServerBgp,
    /// `GET /v1/projects/{id}/ips`.
    ListIps,
    /// `GET /v1/ips/{id}`.
    GetIp,
    /// `POST /v1/projects/{id}/ips`.
    CreateIp,
    /// `PUT /v1/ips/{id} {"targeted_to":"<server>"}`.
    RetargetIp,
    /// `PUT /v1/ips/{id} {"targeted_to":"0"}`.
    UnassignIp,
    /// `DELETE /v1/ips/{id}`.
    DeleteIp,
    /// `GET /v1/regions`.
    ListRegions,
    /// Reads an asynchronous action (Hetzner Cloud).
    GetAction,
}

impl Op {
    /// A stable snake_case name (log field, metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GetProject => "get_project",
            Self::EnableProjectBgp => "enable_project_bgp",
            Self::GetServer => "get_server",
            Self::ListServers => "list_servers",
            Self::UpdateServerBgp => "update_server_bgp",
            Self::ListIps => "list_ips",
            Self::GetIp => "get_ip",
            Self::CreateIp => "create_ip",
            Self::RetargetIp => "retarget_ip",
            Self::UnassignIp => "unassign_ip",
            Self::DeleteIp => "delete_ip",
            Self::ListRegions => "list_regions",
            Self::GetAction => "get_action",
        }
    }

    /// The HTTP route of the operation on `cloud` (see [`Op::route`]).
    pub fn route_on(self, cloud: crate::CloudKind) -> &'static str {
        if cloud == crate::CloudKind::Cherry {
            return self.route();
        }
        match self {
            Self::GetProject | Self::EnableProjectBgp | Self::UpdateServerBgp => "none",
            Self::GetServer => "GET /v1/servers/{id}",
            Self::ListServers => "GET /v1/servers",
            Self::ListIps => "GET /v1/floating_ips",
            Self::GetIp => "GET /v1/floating_ips/{id}",
            Self::CreateIp => "POST /v1/floating_ips",
            Self::RetargetIp => "POST /v1/floating_ips/{id}/actions/assign",
            Self::UnassignIp => "POST /v1/floating_ips/{id}/actions/unassign",
            Self::DeleteIp => "DELETE /v1/floating_ips/{id}",
            Self::ListRegions => "GET /v1/locations",
            Self::GetAction => "GET /v1/actions/{id}",
        }
    }

    /// The HTTP route of the operation on Cherry Servers, with its path parameters left as `{id}`
    /// (a metric label of bounded cardinality).
    pub fn route(self) -> &'static str {
        match self {
            Self::GetProject => "GET /v1/projects/{id}",
            Self::EnableProjectBgp => "PUT /v1/projects/{id}",
            Self::GetServer => "GET /v1/servers/{id}",
            Self::ListServers => "GET /v1/projects/{id}/servers",
            Self::UpdateServerBgp => "PUT /v1/servers/{id}",
            Self::ListIps => "GET /v1/projects/{id}/ips",
            Self::GetIp => "GET /v1/ips/{id}",
            Self::CreateIp => "POST /v1/projects/{id}/ips",
            Self::RetargetIp | Self::UnassignIp => "PUT /v1/ips/{id}",
            Self::DeleteIp => "DELETE /v1/ips/{id}",
            Self::ListRegions => "GET /v1/regions",
            Self::GetAction => "GET /v1/actions/{id}",
        }
    }

    /// Whether repeating the call has the same effect as making it once (GET, PUT, DELETE).
    /// Only these are retried automatically; creation gets its own tag-based protocol.
    pub fn is_idempotent(self) -> bool {
        !matches!(self, Self::CreateIp)
    }

    /// Whether the operation changes something (every call that is not a `GET`). Only writes
    /// are fenced (see [`crate::Fence`]); reads are allowed to every replica.
    pub fn is_write(self) -> bool {
        !matches!(
            self,
            Self::GetProject
                | Self::GetServer
                | Self::ListServers
                | Self::ListIps
                | Self::GetIp
                | Self::ListRegions
                | Self::GetAction
        )
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operation acted on, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object(pub String);

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An error from the cloud layer. The API key never appears in it.
/// An action that ended in `error`: its id, command and the API's code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionFailure {
    /// The action's id.
    pub id: u64,
    /// Its command, e.g. `assign_floating_ip`.
    pub command: String,
    /// The error code.
    pub code: String,
    /// The error text.
    pub message: String,
}

impl fmt::Display for ActionFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "action {} ({}) failed: {}: {}",
            self.id, self.command, self.code, self.message
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The API answered with an error status and a JSON `{code, message}` body.
    #[error("{op} {object}: API error {status}: {message} (code {code})")]
    Api {
        /// The operation.
        op: Op,
        /// The object (`project 123`, `ip <uuid>`, ...).
        object: Object,
        /// HTTP status.
        status: u16,
        /// The body's `code`.
        code: i64,
        /// The body's `message`.
        message: String,
        /// The `Retry-After` the API asked for, if any.
        retry_after: Option<Duration>,
    },
    /// The API answered with an error status and a body that is not a JSON error.
    /// The API refused the call with a named error code (Hetzner Cloud's
    /// `{"error": {"code": "locked", "message": …}}`).
    #[error("{op} {object}: API error {status} {code}: {message}")]
    Coded {
        /// The operation.
        op: Op,
        /// What it was about.
        object: Object,
        /// HTTP status.
        status: u16,
        /// The API's code, e.g. `locked`, `conflict`, `not_found`.
        code: Box<str>,
        /// The API's text.
        message: Box<str>,
        /// `Retry-After`, if sent.
        retry_after: Option<Duration>,
    },
    /// An asynchronous action the API accepted ended in `error` (Hetzner Cloud's actions): the
    /// change did not happen.
    #[error("{op} {object}: {action}")]
    ActionFailed {
        /// The operation.
        op: Op,
        /// What it was about.
        object: Object,
        /// The action and its error.
        action: Box<ActionFailure>,
    },
    /// An accepted action did not end within the client's time for it: whether it will is
    /// unknown (the object is read back).
    #[error("{op} {object}: action {action} still running after {waited:?}")]
    ActionTimeout {
        /// The operation.
        op: Op,
        /// What it was about.
        object: Object,
        /// The action's id.
        action: u64,
        /// How long the client followed it.
        waited: Duration,
    },
    #[error("{op} {object}: API error {status} with a non-JSON body: {snippet:?}")]
    UnexpectedBody {
        /// The operation.
        op: Op,
        /// The object.
        object: Object,
        /// HTTP status.
        status: u16,
        /// The first bytes of the body (the API key, if echoed, is masked).
        snippet: String,
        /// The `Retry-After` the API asked for, if any.
        retry_after: Option<Duration>,
    },
    /// The request did not complete (connect error, reset, timeout).
    #[error("{op} {object}: {kind} error talking to the API")]
    Transport {
        /// The operation.
        op: Op,
        /// The object.
        object: Object,
        /// `timeout`, `connect` or `transport`.
        kind: &'static str,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// A success response whose body does not parse.
    #[error("{op} {object}: cannot decode the API response")]
    Decode {
        /// The operation.
        op: Op,
        /// The object.
        object: Object,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The request was refused before it was sent.
    #[error("{op} {object}: invalid request: {reason}")]
    InvalidRequest {
        /// The operation.
        op: Op,
        /// The object.
        object: Object,
        /// Why.
        reason: String,
    },
    /// A write was not sent because the handle's [`Fence`](crate::Fence) said no: this replica's
    /// leadership ended, or would end before the call could be sent (queued behind the rate
    /// gate, or a retry delay reaching past the deadline).
    #[error(
        "{op} {object}: not sent: this replica's leadership ended (fenced){}",
        after.as_ref().map(|e| format!("; the previous attempt failed: {e}")).unwrap_or_default()
    )]
    Fenced {
        /// The operation.
        op: Op,
        /// The object.
        object: Object,
        /// The error of this call's previous attempt, if an attempt was sent before the fence
        /// closed (its outcome decides [`CloudError::outcome_unknown`]).
        #[source]
        after: Option<Box<Self>>,
    },
    /// The client configuration is unusable.
    #[error("invalid cloud client configuration: {0}")]
    Config(String),
}

impl CloudError {
    /// The HTTP status, if the API answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::UnexpectedBody { status, .. } | Self::Coded { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }

    /// The operation that failed.
    pub fn op(&self) -> Option<Op> {
        match self {
            Self::Api { op, .. }
            | Self::UnexpectedBody { op, .. }
            | Self::Coded { op, .. }
            | Self::ActionFailed { op, .. }
            | Self::ActionTimeout { op, .. }
            | Self::Transport { op, .. }
            | Self::Decode { op, .. }
            | Self::InvalidRequest { op, .. }
            | Self::Fenced { op, .. } => Some(*op),
            Self::Config(_) => None,
        }
    }

    /// The object of the failed operation.
    pub fn object(&self) -> Option<&str> {
        match self {
            Self::Api { object, .. }
            | Self::UnexpectedBody { object, .. }
            | Self::Coded { object, .. }
            | Self::ActionFailed { object, .. }
            | Self::ActionTimeout { object, .. }
            | Self::Transport { object, .. }
            | Self::Decode { object, .. }
            | Self::InvalidRequest { object, .. }
            | Self::Fenced { object, .. } => Some(&object.0),
            Self::Config(_) => None,
        }
    }

    /// The API's `{code, message}`, if it sent one.
    pub fn api_error(&self) -> Option<(i64, &str)> {
        match self {
            Self::Api { code, message, .. } => Some((*code, message)),
            _ => None,
        }
    }

    /// Whether a [`Fence`](crate::Fence) stopped the call ([`CloudError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    /// 404 (403 is treated the same on IPs by the other tools; we keep it distinct).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// The `Retry-After` the API asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Api { retry_after, .. }
            | Self::UnexpectedBody { retry_after, .. }
            | Self::Coded { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether an idempotent call that failed this way may be repeated:
    /// 408/429/502/503/504 and transport errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            // 409 `conflict` and 423 `locked` (another action runs) pass; `protected` does not.
            Self::Coded { status, code, .. } => {
                is_retryable_status(*status)
                    || *status == 409
                    || &**code == "locked"
                    || (*status >= 500 && *status != 501)
            }
            _ => self.status().is_some_and(is_retryable_status),
        }
    }

    /// Whether the request may have taken effect on the server although it failed: everything
    /// except a definite refusal (a 4xx other than 408, which the server answers before acting).
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Decode { .. } | Self::ActionTimeout { .. } => true,
            Self::Api { status, .. } | Self::UnexpectedBody { status, .. } | Self::Coded { status, .. } => {
                *status == 408 || *status >= 500
            }
            // Fenced: this attempt was not sent; an earlier one may have been.
            Self::Fenced { after, .. } => after.as_ref().is_some_and(|e| e.outcome_unknown()),
            Self::ActionFailed { .. } | Self::InvalidRequest { .. } | Self::Config(_) => false,
        }
    }

    /// A stable category for metrics and Kubernetes Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Coded { code, .. } if &**code == "locked" => "locked",
            Self::Coded { code, .. } if &**code == "conflict" => "conflict",
            Self::ActionFailed { .. } => "action_failed",
            Self::ActionTimeout { .. } => "timeout",
            Self::Api { status, .. } | Self::UnexpectedBody { status, .. } | Self::Coded { status, .. } => {
                match status {
                    401 => "unauthorized",
                    403 => "forbidden",
                    404 => "not_found",
                    429 => "rate_limited",
                    408 | 504 => "timeout",
                    500..=599 => "server_error",
                    _ => "rejected",
                }
            }
            Self::Transport { kind, .. } => {
                if *kind == "timeout" {
                    "timeout"
                } else {
                    "transport"
                }
            }
            Self::Decode { .. } => "decode",
            Self::InvalidRequest { .. } => "invalid_request",
            Self::Fenced { .. } => "fenced",
            Self::Config(_) => "config",
        }
    }
}

/// The statuses an idempotent call is retried on.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests;
