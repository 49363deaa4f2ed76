//! TSIG keys in BIND's key-file format, as written by `tsig-keygen`:
//!
//! ```text
//! key "baton-c1" {
//!         algorithm hmac-sha256;
//!         secret "kq3V…base64…=";
//! };
//! ```
//!
//! Comments (`#`, `//`, `/* */`) are ignored; the first `key` clause is used. The secret is
//! kept in a [`Secret`] and never printed.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use baton_core::Secret;
use hickory_proto::rr::rdata::tsig::TsigAlgorithm;
use hickory_proto::rr::{Name, TSigner};

/// Why a TSIG key file is unusable. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum TsigKeyError {
    /// The file could not be read.
    #[error("cannot read TSIG key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not in BIND's `key "name" { algorithm …; secret "…"; };` format.
    #[error("TSIG key file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (no secret material included).
        reason: String,
    },
}

/// A TSIG key: name, algorithm and secret.
#[derive(Debug, Clone)]
pub struct TsigKey {
    name: String,
    algorithm: String,
    secret: Secret,
}

/// Fudge (allowed clock skew) of our signatures, in seconds (RFC 8945 recommends 300).
const FUDGE: u16 = 300;

impl TsigKey {
    /// Builds a key from its parts; `secret_base64` is the base64 key material.
    pub fn new(name: &str, algorithm: &str, secret_base64: Secret) -> Result<Self, String> {
        Name::from_ascii(name).map_err(|e| format!("invalid key name {name:?}: {e}"))?;
        algorithm_of(algorithm)?;
        decode(&secret_base64)?;
        Ok(Self {
            name: name.trim_end_matches('.').to_owned(),
            algorithm: algorithm.to_ascii_lowercase(),
            secret: secret_base64,
        })
    }

    /// Reads a BIND key file.
    pub fn from_file(path: &Path) -> Result<Self, TsigKeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| TsigKeyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| TsigKeyError::Parse {
            path: path.to_owned(),
            reason,
        })
    }

    /// Parses the text of a BIND key file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tokens = tokenize(text)?;
        let mut it = tokens.iter().map(String::as_str).peekable();
        while let Some(token) = it.next() {
            if token != "key" {
                continue;
            }
            let name = it.next().ok_or("missing key name after `key`")?;
            if it.next() != Some("{") {
                return Err(format!("expected `{{` after key {name:?}"));
            }
            let (mut algorithm, mut secret) = (None, None);
            loop {
                match it.next() {
                    Some("}") => break,
                    Some("algorithm") => algorithm = Some(it.next().ok_or("missing algorithm value")?),
                    Some("secret") => secret = Some(it.next().ok_or("missing secret value")?),
                    Some(";") => continue,
                    Some(other) => return Err(format!("unexpected {other:?} in key {name:?}")),
                    None => return Err(format!("unterminated key {name:?}")),
                }
                if it.next() != Some(";") {
                    return Err(format!("expected `;` in key {name:?}"));
                }
            }
            let algorithm = algorithm.ok_or_else(|| format!("key {name:?} has no algorithm"))?;
            let secret = secret.ok_or_else(|| format!("key {name:?} has no secret"))?;
            return Self::new(name, algorithm, Secret::new(secret));
        }
        Err("no `key \"name\" { … };` clause found".into())
    }

    /// The key name (without trailing dot).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm name, e.g. `hmac-sha256`.
    pub fn algorithm(&self) -> &str {
        &self.algorithm
    }

    /// The hickory signer for this key.
    pub(crate) fn signer(&self) -> Result<TSigner, String> {
        let name = Name::from_ascii(format!("{}.", self.name)).map_err(|e| format!("key name: {e}"))?;
        TSigner::new(decode(&self.secret)?, algorithm_of(&self.algorithm)?, name, FUDGE)
            .map_err(|e| format!("unusable TSIG key {:?}: {e}", self.name))
    }
}

fn decode(secret: &Secret) -> Result<Vec<u8>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(secret.expose().trim())
        .map_err(|_| "the secret is not valid base64".to_owned())?;
    if bytes.is_empty() {
        return Err("the secret is empty".into());
    }
    Ok(bytes)
}

fn algorithm_of(name: &str) -> Result<TsigAlgorithm, String> {
    match name.to_ascii_lowercase().trim_end_matches('.') {
        "hmac-sha256" => Ok(TsigAlgorithm::HmacSha256),
        "hmac-sha384" => Ok(TsigAlgorithm::HmacSha384),
        "hmac-sha512" => Ok(TsigAlgorithm::HmacSha512),
        other => Err(format!("unsupported TSIG algorithm {other:?} (use hmac-sha256)")),
    }
}

/// Splits BIND configuration text into words, quoted strings (unquoted) and `{ } ;`.
fn tokenize(text: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '#' => while chars.next_if(|c| *c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'/') => while chars.next_if(|c| *c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                loop {
                    match chars.next() {
                        Some('/') if prev == '*' => break,
                        Some(c) => prev = c,
                        None => return Err("unterminated /* comment".into()),
                    }
                }
            }
            '{' | '}' | ';' => tokens.push(c.to_string()),
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => s.push(c),
                        None => return Err("unterminated quoted string".into()),
                    }
                }
                tokens.push(s);
            }
            c => {
                let mut s = c.to_string();
                while let Some(c) =
                    chars.next_if(|c| !c.is_whitespace() && !matches!(c, '{' | '}' | ';' | '"'))
                {
                    s.push(c);
                }
                tokens.push(s);
            }
        }
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests;
