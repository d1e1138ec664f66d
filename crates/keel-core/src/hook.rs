//! Webhooks as pure decisions: whether a delivery is signed by the sender that holds the
//! hook's secret, and which id names the delivery (so a redelivery starts nothing new).
//!
//! Three schemes, each the sender's own:
//! - `github`: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`; the delivery
//!   is `X-GitHub-Delivery`.
//! - `stripe`: `Stripe-Signature: t=<unix secs>,v1=<hex HMAC-SHA256 of "t.body">[,v1=...]`,
//!   refused outside a tolerance of the signed time; the delivery is the event's `id`.
//! - `hmac-sha256`: a header of the hook's choosing (default `X-Keel-Signature`) holding
//!   `sha256=<hex>` or the bare hex HMAC-SHA256 of the body.
//!
//! Any scheme also takes `Idempotency-Key` as the delivery id. Comparisons of MACs are
//! constant-time (`Hmac::verify_slice`). The clock is an argument; nothing here reads one.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The default header of the generic `hmac-sha256` scheme.
pub const DEFAULT_HMAC_HEADER: &str = "X-Keel-Signature";

/// Stripe's own default tolerance between the signed time and now.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// The longest delivery id kept (longer ones are refused: they are not ids).
pub const MAX_DELIVERY_ID: usize = 200;

/// How a hook's deliveries are verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    Github,
    Stripe { tolerance_secs: u64 },
    HmacSha256 { header: String },
}

impl Verify {
    /// The scheme by name, with its options (`header` only for `hmac-sha256`,
    /// `tolerance_secs` only for `stripe`).
    pub fn new(scheme: &str, header: Option<&str>, tolerance_secs: Option<u64>) -> Result<Verify, String> {
        let verify = match scheme {
            "github" => Verify::Github,
            "stripe" => {
                let tolerance_secs = tolerance_secs.unwrap_or(DEFAULT_TOLERANCE_SECS);
                if tolerance_secs == 0 || tolerance_secs > 86_400 {
                    return Err(format!(
                        "tolerance_secs {tolerance_secs} is out of range: give 1 to 86400 seconds (Stripe's default is 300)"
                    ));
                }
                Verify::Stripe { tolerance_secs }
            }
            "hmac-sha256" => {
                let header = header.unwrap_or(DEFAULT_HMAC_HEADER);
                let valid = !header.is_empty()
                    && header.len() <= 64
                    && header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                if !valid {
                    return Err(format!(
                        "header {header:?} is not a header name: use letters, digits and '-' (at most 64)"
                    ));
                }
                Verify::HmacSha256 { header: header.to_owned() }
            }
            other => {
                return Err(format!("verify {other:?} is not a scheme; use github, stripe or hmac-sha256"));
            }
        };
        if header.is_some() && !matches!(verify, Verify::HmacSha256 { .. }) {
            return Err(format!("header is only for hmac-sha256; {scheme} signs in its own header"));
        }
        if tolerance_secs.is_some() && !matches!(verify, Verify::Stripe { .. }) {
            return Err(format!("tolerance_secs is only for stripe; {scheme} signs no time"));
        }
        Ok(verify)
    }

    /// The scheme's name.
    pub fn scheme(&self) -> &'static str {
        match self {
            Verify::Github => "github",
            Verify::Stripe { .. } => "stripe",
            Verify::HmacSha256 { .. } => "hmac-sha256",
        }
    }

    /// The header that carries the signature.
    pub fn signature_header(&self) -> &str {
        match self {
            Verify::Github => "X-Hub-Signature-256",
            Verify::Stripe { .. } => "Stripe-Signature",
            Verify::HmacSha256 { header } => header,
        }
    }
}

impl fmt::Display for Verify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme())
    }
}

impl FromStr for Verify {
    type Err = String;
    fn from_str(s: &str) -> Result<Verify, String> {
        Verify::new(s, None, None)
    }
}

/// Why a delivery was refused. The text is safe to send back: it never holds the secret
/// or the expected MAC.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the {header} header is missing: the delivery is not signed")]
    Missing { header: String },
    #[error("the {header} header is not in the {scheme} form ({expected})")]
    Malformed { header: String, scheme: &'static str, expected: &'static str },
    #[error("the signature in {header} does not match the body signed with the hook's secret")]
    Mismatch { header: String },
    #[error(
        "the Stripe-Signature timestamp is {age_secs} s from now, outside the tolerance of {tolerance_secs} s (a replay, or a clock off)"
    )]
    Stale { age_secs: u64, tolerance_secs: u64 },
}

/// Checks a delivery's signature with `secret` at `now_secs`.
pub fn verify(
    verify: &Verify,
    secret: &[u8],
    header: impl Fn(&str) -> Option<String>,
    body: &[u8],
    now_secs: u64,
) -> Result<(), Refusal> {
    let name = verify.signature_header();
    let value = header(name).ok_or_else(|| Refusal::Missing { header: name.to_owned() })?;
    match verify {
        Verify::Github => {
            let hex = value.trim().strip_prefix("sha256=").ok_or_else(|| Refusal::Malformed {
                header: name.to_owned(),
                scheme: "github",
                expected: "sha256=<hex digest>",
            })?;
            let given = decode(hex, name, "github", "sha256=<hex digest>")?;
            check(secret, &[body], &given, name)
        }
        Verify::HmacSha256 { .. } => {
            let trimmed = value.trim();
            let hex = trimmed.strip_prefix("sha256=").unwrap_or(trimmed);
            let given = decode(hex, name, "hmac-sha256", "sha256=<hex digest> or <hex digest>")?;
            check(secret, &[body], &given, name)
        }
        Verify::Stripe { tolerance_secs } => {
            const EXPECTED: &str = "t=<unix seconds>,v1=<hex digest>";
            let malformed =
                || Refusal::Malformed { header: name.to_owned(), scheme: "stripe", expected: EXPECTED };
            let mut timestamp: Option<&str> = None;
            let mut signatures = Vec::new();
            for part in value.split(',') {
                let (key, val) = part.trim().split_once('=').ok_or_else(malformed)?;
                match key {
                    "t" => timestamp = Some(val),
                    "v1" => signatures.push(val),
                    _ => {} // v0 (test mode's old scheme) and future versions are ignored, as Stripe's libraries do
                }
            }
            let timestamp = timestamp.ok_or_else(malformed)?;
            let signed_at: u64 = timestamp.parse().map_err(|_| malformed())?;
            if signatures.is_empty() {
                return Err(malformed());
            }
            // The signature first (a forged delivery learns nothing about the clock).
            let mut matched = false;
            for signature in signatures {
                let Ok(given) = hex::decode(signature) else { continue };
                if check(secret, &[timestamp.as_bytes(), b".", body], &given, name).is_ok() {
                    matched = true;
                }
            }
            if !matched {
                return Err(Refusal::Mismatch { header: name.to_owned() });
            }
            let age_secs = now_secs.abs_diff(signed_at);
            if age_secs > *tolerance_secs {
                return Err(Refusal::Stale { age_secs, tolerance_secs: *tolerance_secs });
            }
            Ok(())
        }
    }
}

fn decode(hex: &str, header: &str, scheme: &'static str, expected: &'static str) -> Result<Vec<u8>, Refusal> {
    match hex::decode(hex.trim()) {
        Ok(bytes) if bytes.len() == 32 => Ok(bytes),
        _ => Err(Refusal::Malformed { header: header.to_owned(), scheme, expected }),
    }
}

fn check(secret: &[u8], parts: &[&[u8]], given: &[u8], header: &str) -> Result<(), Refusal> {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(given).map_err(|_| Refusal::Mismatch { header: header.to_owned() })
}

/// The hex HMAC-SHA256 of `parts` under `secret` (what a sender computes; tests and the
/// CLI's `keel hook sign` use it).
pub fn sign(secret: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    keel_types::hex(&mac.finalize().into_bytes())
}

/// The id that names a delivery, if the sender gave one: `X-GitHub-Delivery` for
/// `github`, the event's `id` in the JSON body for `stripe`, else `Idempotency-Key`.
/// `Err` when a given id is not usable (empty, too long, or with control characters).
pub fn delivery_id(
    verify: &Verify,
    header: impl Fn(&str) -> Option<String>,
    json_body: Option<&serde_json::Value>,
) -> Result<Option<String>, String> {
    let own = match verify {
        Verify::Github => header("X-GitHub-Delivery").map(|id| ("X-GitHub-Delivery", id)),
        Verify::Stripe { .. } => json_body
            .and_then(|body| body.get("id"))
            .and_then(serde_json::Value::as_str)
            .map(|id| ("the event's id", id.to_owned())),
        Verify::HmacSha256 { .. } => None,
    };
    let Some((from, id)) = own.or_else(|| header("Idempotency-Key").map(|id| ("Idempotency-Key", id))) else {
        return Ok(None);
    };
    let id = id.trim().to_owned();
    if id.is_empty() || id.len() > MAX_DELIVERY_ID || id.chars().any(char::is_control) {
        return Err(format!(
            "{from} is not a usable delivery id: give 1-{MAX_DELIVERY_ID} printable characters"
        ));
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn github_s_documented_example_verifies() {
        // The example GitHub's documentation gives for validating deliveries.
        let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(SECRET, &[BODY]), signature.trim_start_matches("sha256="));
        let given = [("x-hub-signature-256", signature)];
        assert_eq!(verify(&Verify::Github, SECRET, headers(&given), BODY, 0), Ok(()));
    }

    #[test]
    fn a_changed_body_a_wrong_secret_or_a_missing_header_is_refused() {
        let signature = format!("sha256={}", sign(SECRET, &[BODY]));
        let given = [("X-Hub-Signature-256", signature.as_str())];
        let mismatch = Err(Refusal::Mismatch { header: "X-Hub-Signature-256".into() });
        assert_eq!(verify(&Verify::Github, SECRET, headers(&given), b"Hello, World?", 0), mismatch);
        assert_eq!(verify(&Verify::Github, b"other", headers(&given), BODY, 0), mismatch);
        assert_eq!(
            verify(&Verify::Github, SECRET, headers(&[]), BODY, 0),
            Err(Refusal::Missing { header: "X-Hub-Signature-256".into() })
        );
        for bad in
            ["757107ea", "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", "sha256=zz"]
        {
            let given = [("X-Hub-Signature-256", bad)];
            assert!(
                matches!(
                    verify(&Verify::Github, SECRET, headers(&given), BODY, 0),
                    Err(Refusal::Malformed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn stripe_signs_the_timestamp_and_body_within_a_tolerance() {
        let stripe = Verify::new("stripe", None, None).unwrap();
        let t = 1_700_000_000u64;
        let v1 = sign(SECRET, &[t.to_string().as_bytes(), b".", BODY]);
        let header =
            format!("t={t},v1={v1},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39");
        let given = [("Stripe-Signature", header.as_str())];
        assert_eq!(verify(&stripe, SECRET, headers(&given), BODY, t + 299), Ok(()));
        assert_eq!(verify(&stripe, SECRET, headers(&given), BODY, t - 300), Ok(()));
        assert_eq!(
            verify(&stripe, SECRET, headers(&given), BODY, t + 301),
            Err(Refusal::Stale { age_secs: 301, tolerance_secs: 300 })
        );
        // Several v1 signatures (a secret being rolled): any one matching is enough.
        let rolled = format!("t={t},v1={},v1={v1}", sign(b"old", &[t.to_string().as_bytes(), b".", BODY]));
        let given = [("Stripe-Signature", rolled.as_str())];
        assert_eq!(verify(&stripe, SECRET, headers(&given), BODY, t), Ok(()));
        // The timestamp is signed: moving it breaks the signature, not only the tolerance.
        let moved = format!("t={},v1={v1}", t + 1);
        let given = [("Stripe-Signature", moved.as_str())];
        assert_eq!(
            verify(&stripe, SECRET, headers(&given), BODY, t),
            Err(Refusal::Mismatch { header: "Stripe-Signature".into() })
        );
        for bad in ["v1=abc", "t=abc,v1=00", "t=1", "garbage"] {
            let given = [("Stripe-Signature", bad)];
            assert!(
                matches!(verify(&stripe, SECRET, headers(&given), BODY, t), Err(Refusal::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_generic_scheme_reads_its_own_header_with_or_without_a_prefix() {
        let generic = Verify::new("hmac-sha256", Some("X-Signature"), None).unwrap();
        let hex = sign(SECRET, &[BODY]);
        for value in [hex.clone(), format!("sha256={hex}"), hex.to_uppercase()] {
            let given = [("x-signature", value.as_str())];
            assert_eq!(verify(&generic, SECRET, headers(&given), BODY, 0), Ok(()), "{value}");
        }
        let default = Verify::new("hmac-sha256", None, None).unwrap();
        assert_eq!(default.signature_header(), DEFAULT_HMAC_HEADER);
    }

    #[test]
    fn schemes_and_their_options_are_checked() {
        assert!(Verify::new("md5", None, None).unwrap_err().contains("github, stripe or hmac-sha256"));
        assert!(Verify::new("github", Some("X-A"), None).unwrap_err().contains("only for hmac-sha256"));
        assert!(Verify::new("github", None, Some(5)).unwrap_err().contains("only for stripe"));
        assert!(Verify::new("stripe", None, Some(0)).is_err());
        assert!(Verify::new("hmac-sha256", Some("X A"), None).is_err());
        assert_eq!(Verify::new("stripe", None, Some(60)), Ok(Verify::Stripe { tolerance_secs: 60 }));
    }

    #[test]
    fn the_delivery_id_is_the_sender_s_own_else_the_idempotency_key() {
        let github =
            [("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"), ("Idempotency-Key", "k")];
        assert_eq!(
            delivery_id(&Verify::Github, headers(&github), None),
            Ok(Some("72d3162e-cc78-11e3-81ab-4c9367dc0958".into()))
        );
        let stripe = Verify::new("stripe", None, None).unwrap();
        let event = serde_json::json!({"id": "evt_1", "type": "charge.succeeded"});
        assert_eq!(delivery_id(&stripe, headers(&[]), Some(&event)), Ok(Some("evt_1".into())));
        let generic = Verify::new("hmac-sha256", None, None).unwrap();
        assert_eq!(
            delivery_id(&generic, headers(&[("idempotency-key", "a-1")]), None),
            Ok(Some("a-1".into()))
        );
        assert_eq!(delivery_id(&generic, headers(&[]), None), Ok(None));
        let long = "x".repeat(MAX_DELIVERY_ID + 1);
        assert!(delivery_id(&generic, headers(&[("Idempotency-Key", long.as_str())]), None).is_err());
        assert!(delivery_id(&generic, headers(&[("Idempotency-Key", " ")]), None).is_err());
    }
}
