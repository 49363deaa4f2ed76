//! Who may read an admin endpoint: the bearer token is authenticated by a TokenReview and the
//! user it names authorised by a SubjectAccessReview for `get` on the request's path (a
//! nonResourceURL), both asked of the API server, as controller-runtime's secure metrics and
//! kube-rbac-proxy do.
//!
//! ```text
//!  token ─► ReviewCache (sha256 of token + path; allowed for 60 s, refusals for 10 s)
//!            └ miss ─► TokenReview ─► authenticated? ─► SubjectAccessReview(user, groups, path, get)
//! ```
//!
//! The token is never logged, kept, or put in an error: the cache holds its hash. A review that
//! fails (the API server unreachable) is not cached and answers 503.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::HeaderValue;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

/// How long an allowed token is remembered for a path.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refusal (unknown token, or not authorised) is remembered.
pub const REFUSED_TTL: Duration = Duration::from_secs(10);
/// The longest one review may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// The most tokens remembered; beyond, the oldest answers are dropped.
pub const CACHE_ENTRIES: usize = 1024;

/// Whether a request may read an admin endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The token's user may `get` the path.
    Allowed {
        /// The user the token names.
        user: String,
    },
    /// No bearer token, or one the API server does not authenticate (401).
    Unauthenticated(&'static str),
    /// An authenticated user without the permission (403).
    Forbidden {
        /// The user the token names.
        user: String,
    },
    /// The API server could not answer the review (503, not remembered).
    Unavailable(String),
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case), if any.
pub fn bearer_token(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Recent verdicts by a hash of the token and the path.
#[derive(Debug, Default)]
pub struct ReviewCache {
    entries: HashMap<[u8; 32], (Instant, Verdict)>,
}

impl ReviewCache {
    fn key(token: &str, path: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(token.as_bytes());
        h.update([0]);
        h.update(path.as_bytes());
        h.finalize().into()
    }

    /// The remembered verdict for `token` on `path`, if it is still fresh at `now`.
    pub fn get(&self, token: &str, path: &str, now: Instant) -> Option<Verdict> {
        self.entries
            .get(&Self::key(token, path))
            .filter(|(expires, _)| now < *expires)
            .map(|(_, v)| v.clone())
    }

    /// Remembers `verdict` (not an [`Verdict::Unavailable`] one) for its time to live.
    pub fn insert(&mut self, token: &str, path: &str, verdict: Verdict, now: Instant) {
        let ttl = match verdict {
            Verdict::Allowed { .. } => ALLOWED_TTL,
            Verdict::Unauthenticated(_) | Verdict::Forbidden { .. } => REFUSED_TTL,
            Verdict::Unavailable(_) => return,
        };
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, (expires, _)| now < *expires);
        }
        if self.entries.len() >= CACHE_ENTRIES {
            // Still full of fresh answers (a flood of tokens): drop those that expire first.
            let mut expiries: Vec<Instant> = self.entries.values().map(|(e, _)| *e).collect();
            expiries.sort_unstable();
            let cut = expiries[expiries.len() / 2];
            self.entries.retain(|_, (expires, _)| *expires > cut);
        }
        self.entries.insert(Self::key(token, path), (now + ttl, verdict));
    }

    /// How many answers are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Asks the API server who a token is and whether it may read a path (needs `create` on
/// `tokenreviews` and `subjectaccessreviews`).
pub struct Authorizer {
    client: kube::Client,
    cache: Mutex<ReviewCache>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").finish_non_exhaustive()
    }
}

impl Authorizer {
    /// An authorizer asking through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(ReviewCache::default()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, ReviewCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The verdict for a request with `token` (from [`bearer_token`]) on `path`.
    pub async fn check(&self, token: Option<&str>, path: &str) -> Verdict {
        let Some(token) = token else {
            return Verdict::Unauthenticated("no bearer token");
        };
        if let Some(v) = self.cache().get(token, path, Instant::now()) {
            return v;
        }
        let verdict = self.review(token, path).await;
        self.cache().insert(token, path, verdict.clone(), Instant::now());
        verdict
    }

    async fn review(&self, token: &str, path: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = match tokio::time::timeout(
            REVIEW_TIMEOUT,
            Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review),
        )
        .await
        {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Verdict::Unavailable(format!("TokenReview: {e}")),
            Err(_) => {
                return Verdict::Unavailable(format!("TokenReview: no answer within {REVIEW_TIMEOUT:?}"));
            }
        };
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Verdict::Unauthenticated("token not valid");
        }
        let user = status.user.unwrap_or_default();
        let name = user.username.clone().unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        match tokio::time::timeout(
            REVIEW_TIMEOUT,
            Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &sar),
        )
        .await
        {
            Ok(Ok(r)) if r.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed { user: name },
            Ok(Ok(_)) => Verdict::Forbidden { user: name },
            Ok(Err(e)) => Verdict::Unavailable(format!("SubjectAccessReview: {e}")),
            Err(_) => Verdict::Unavailable(format!(
                "SubjectAccessReview: no answer within {REVIEW_TIMEOUT:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
