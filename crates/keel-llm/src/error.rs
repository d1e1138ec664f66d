//! Errors: the crate's `Error`, upstream failures with their [`ErrorClass`] (which decides
//! retries and fallback), and the pure mapping from a provider's HTTP status and error body
//! to a class and a message a person can act on.

use std::time::Duration;

use serde_json::Value;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The script has no answer for this request.
    #[error(
        "the LLM script has no response for this request (last user message: {last_user:?}); \
         {served} ordered responses were already served. Add a response, or a `match` entry \
         whose text occurs in that message"
    )]
    NoScriptedResponse { last_user: String, served: usize },
    /// The script document itself is malformed.
    #[error("invalid LLM script: {0}")]
    InvalidScript(String),
    /// A provider refused or failed the call (or could not be reached).
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
    /// Every model of the fallback chain failed; `last` is the final failure.
    #[error("every model in the fallback chain failed ({}); the last error: {last}", tried.join(", "))]
    FallbackExhausted { tried: Vec<String>, last: Box<Error> },
    /// A request this gateway cannot express, or a provider-shaped request body (sent to a
    /// compatibility endpoint) that is not valid.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// `keel.toml` (or the environment) configures the providers wrongly.
    #[error("invalid LLM configuration: {0}")]
    Config(String),
    /// The model names no configured provider.
    #[error("{0}")]
    NoRoute(String),
}

impl Error {
    /// The class of the failure that ended the call, for mapping to a status code.
    /// `None` for errors that are not about a provider's answer (script, config).
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            Error::Upstream(upstream) => Some(upstream.class),
            Error::FallbackExhausted { last, .. } => last.class(),
            Error::InvalidRequest(_) => Some(ErrorClass::BadRequest),
            Error::NoScriptedResponse { .. }
            | Error::InvalidScript(_)
            | Error::Config(_)
            | Error::NoRoute(_) => None,
        }
    }

    /// How long the provider asked us to wait before trying again, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Upstream(upstream) => upstream.retry_after,
            Error::FallbackExhausted { last, .. } => last.retry_after(),
            _ => None,
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.class().is_some_and(ErrorClass::is_retryable)
    }
}

/// What kind of failure an upstream call ended in. Decides whether the router retries the
/// same model (`is_retryable`) before it moves to the next model of the fallback chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// 429: too many requests or tokens per minute.
    RateLimited,
    /// 429 `insufficient_quota` and friends: the account is out of credits.
    QuotaExceeded,
    /// 529 / 503 / `overloaded_error`: the provider sheds load.
    Overloaded,
    /// Other 5xx.
    Server,
    /// 408, or no response (or no next byte) in time.
    Timeout,
    /// Connecting failed or the connection broke mid-response.
    Connection,
    /// 409: a conflicting concurrent request; providers' own SDKs retry it.
    Conflict,
    /// A 2xx whose body is not what the provider's API specifies.
    InvalidResponse,
    /// 400 / 422 (other than the more specific classes below).
    BadRequest,
    /// 401: the key is missing or wrong.
    Auth,
    /// 403: the key may not do this.
    PermissionDenied,
    /// 404: no such model or endpoint.
    NotFound,
    /// The request does not fit the model's context window.
    ContextLength,
    /// The provider's safety system refused the request.
    ContentFilter,
    /// Anything else (an unexpected status).
    Other,
}

impl ErrorClass {
    /// Whether trying the same request again, after a pause, can succeed. Deliberately a
    /// match without a wildcard: a new class must decide.
    pub fn is_retryable(self) -> bool {
        match self {
            ErrorClass::RateLimited
            | ErrorClass::Overloaded
            | ErrorClass::Server
            | ErrorClass::Timeout
            | ErrorClass::Connection
            | ErrorClass::Conflict
            | ErrorClass::InvalidResponse => true,
            ErrorClass::QuotaExceeded
            | ErrorClass::BadRequest
            | ErrorClass::Auth
            | ErrorClass::PermissionDenied
            | ErrorClass::NotFound
            | ErrorClass::ContextLength
            | ErrorClass::ContentFilter
            | ErrorClass::Other => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::QuotaExceeded => "quota_exceeded",
            ErrorClass::Overloaded => "overloaded",
            ErrorClass::Server => "server",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connection => "connection",
            ErrorClass::Conflict => "conflict",
            ErrorClass::InvalidResponse => "invalid_response",
            ErrorClass::BadRequest => "bad_request",
            ErrorClass::Auth => "auth",
            ErrorClass::PermissionDenied => "permission_denied",
            ErrorClass::NotFound => "not_found",
            ErrorClass::ContextLength => "context_length",
            ErrorClass::ContentFilter => "content_filter",
            ErrorClass::Other => "other",
        }
    }

    /// The HTTP status a compatibility endpoint should answer with for this class.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorClass::RateLimited | ErrorClass::QuotaExceeded => 429,
            ErrorClass::Overloaded => 529,
            ErrorClass::Server | ErrorClass::InvalidResponse | ErrorClass::Other => 502,
            ErrorClass::Timeout => 504,
            ErrorClass::Connection => 502,
            ErrorClass::Conflict => 409,
            ErrorClass::BadRequest | ErrorClass::ContextLength | ErrorClass::ContentFilter => 400,
            ErrorClass::Auth => 401,
            ErrorClass::PermissionDenied => 403,
            ErrorClass::NotFound => 404,
        }
    }
}

/// A failed upstream call. `message` is complete and actionable; `Display` prefixes the
/// provider's name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{provider}: {message}")]
pub struct UpstreamError {
    /// The configured provider name, e.g. `openai`.
    pub provider: String,
    pub class: ErrorClass,
    /// The HTTP status, when the provider answered.
    pub status: Option<u16>,
    pub message: String,
    /// From `Retry-After` / `retry-after-ms` (or a rate-limit reset), when given.
    pub retry_after: Option<Duration>,
}

impl UpstreamError {
    pub fn new(provider: &str, class: ErrorClass, message: impl Into<String>) -> UpstreamError {
        UpstreamError {
            provider: provider.to_owned(),
            class,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// What the provider's error body says: OpenAI `{"error":{"message","type","code"}}`,
/// Anthropic `{"type":"error","error":{"type","message"}}`, Ollama `{"error":"..."}`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorBody {
    pub message: Option<String>,
    /// `type` (OpenAI, Anthropic).
    pub kind: Option<String>,
    /// `code` (OpenAI).
    pub code: Option<String>,
}

impl ErrorBody {
    pub fn parse(body: &str) -> ErrorBody {
        let Ok(value) = serde_json::from_str::<Value>(body) else {
            let text = body.trim();
            return ErrorBody {
                message: (!text.is_empty()).then(|| text.chars().take(500).collect()),
                ..ErrorBody::default()
            };
        };
        Self::from_value(&value)
    }

    pub fn from_value(value: &Value) -> ErrorBody {
        let error = value.get("error").unwrap_or(value);
        if let Some(text) = error.as_str() {
            return ErrorBody { message: Some(text.to_owned()), ..ErrorBody::default() };
        }
        let text = |key: &str| {
            error.get(key).and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
        };
        ErrorBody { message: text("message"), kind: text("type"), code: text("code") }
    }

    fn mentions(&self, needles: &[&str]) -> bool {
        [&self.kind, &self.code, &self.message]
            .into_iter()
            .flatten()
            .any(|text| needles.iter().any(|needle| text.to_ascii_lowercase().contains(needle)))
    }
}

/// The class of an HTTP error answer. Pure: status and the parsed body decide.
pub fn classify(status: u16, body: &ErrorBody) -> ErrorClass {
    // The body refines a client error; a 429 or 5xx keeps its status's (retryable) class
    // whatever its text says about tokens.
    let client_error = (400..500).contains(&status) && status != 429;
    if client_error
        && body.mentions(&[
            "context_length",
            "context length",
            "maximum context",
            "prompt is too long",
            "too many tokens",
        ])
    {
        return ErrorClass::ContextLength;
    }
    if client_error && body.mentions(&["content_filter", "content_policy", "content policy"]) {
        return ErrorClass::ContentFilter;
    }
    match status {
        400 | 422 => ErrorClass::BadRequest,
        401 => ErrorClass::Auth,
        403 => ErrorClass::PermissionDenied,
        404 => ErrorClass::NotFound,
        408 => ErrorClass::Timeout,
        409 => ErrorClass::Conflict,
        413 => ErrorClass::ContextLength,
        429 if body.mentions(&["insufficient_quota", "billing", "credit balance"]) => {
            ErrorClass::QuotaExceeded
        }
        429 => ErrorClass::RateLimited,
        503 | 529 => ErrorClass::Overloaded,
        500..=599 if body.mentions(&["overloaded"]) => ErrorClass::Overloaded,
        500..=599 => ErrorClass::Server,
        _ => ErrorClass::Other,
    }
}

/// Where the provider's key comes from, so an auth error can say what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Read from this environment variable of the kernel.
    Env(String),
    /// Written in keel.toml.
    Inline,
    /// No key configured (fine for local servers such as Ollama).
    None,
}

/// Everything an error message may mention about the call.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    pub provider: &'a str,
    pub model: &'a str,
    pub url: &'a str,
    pub key: &'a KeySource,
}

/// Builds the upstream error for an HTTP error answer: class plus a message that says what
/// happened and what to do.
pub fn upstream_error(
    context: CallContext<'_>,
    status: u16,
    body: &ErrorBody,
    retry_after: Option<Duration>,
) -> UpstreamError {
    let class = classify(status, body);
    let said = body.message.as_deref().map(str::trim).filter(|m| !m.is_empty()).unwrap_or("no details given");
    let key_advice = match context.key {
        KeySource::Env(var) => format!(
            "set {var} in the kernel's environment (or `api_key_env` for provider `{}` in keel.toml)",
            context.provider
        ),
        KeySource::Inline => format!("fix `api_key` for provider `{}` in keel.toml", context.provider),
        KeySource::None => format!(
            "no API key is configured for provider `{}`: set `api_key_env` in keel.toml",
            context.provider
        ),
    };
    let wait = retry_after.map(|d| format!(" (the provider asks to wait {})", human(d))).unwrap_or_default();
    let message = match class {
        ErrorClass::Auth => format!("{status} invalid API key ({said}); {key_advice}"),
        ErrorClass::PermissionDenied => format!(
            "{status} permission denied for model {:?} ({said}); check that the key's project or organization may use it",
            context.model
        ),
        ErrorClass::NotFound => format!(
            "{status} not found ({said}); check the model name {:?} and the base URL {}",
            context.model, context.url
        ),
        ErrorClass::RateLimited => {
            format!("{status} rate limited{wait} ({said}); Keel retries with backoff and learns the limits")
        }
        ErrorClass::QuotaExceeded => format!(
            "{status} the account is out of quota or credits ({said}); add credits or raise the limit with the provider"
        ),
        ErrorClass::Overloaded => {
            format!("{status} the provider is overloaded{wait} ({said}); try again later")
        }
        ErrorClass::Server => format!("{status} provider server error ({said})"),
        ErrorClass::Timeout => format!("{status} the provider timed out ({said})"),
        ErrorClass::Conflict => format!("{status} conflict ({said})"),
        ErrorClass::ContextLength => format!(
            "{status} the request does not fit model {:?}'s context window ({said}); shorten the conversation or use a model with a larger window",
            context.model
        ),
        ErrorClass::ContentFilter => {
            format!("{status} refused by the provider's content filter ({said})")
        }
        ErrorClass::BadRequest => format!("{status} the provider rejected the request ({said})"),
        ErrorClass::InvalidResponse | ErrorClass::Connection | ErrorClass::Other => {
            format!("{status} unexpected answer ({said})")
        }
    };
    UpstreamError { provider: context.provider.to_owned(), class, status: Some(status), message, retry_after }
}

/// `1.5s`, `250ms`, `2m3s`: short durations for messages.
pub(crate) fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", duration.as_secs_f64())
    } else {
        format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> ErrorBody {
        ErrorBody::parse(text)
    }

    #[test]
    fn statuses_and_bodies_classify() {
        let table: &[(u16, &str, ErrorClass)] = &[
            (400, r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#, ErrorClass::BadRequest),
            (
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens","code":"context_length_exceeded"}}"#,
                ErrorClass::ContextLength,
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"}}"#,
                ErrorClass::ContextLength,
            ),
            (400, r#"{"error":{"message":"flagged","code":"content_filter"}}"#, ErrorClass::ContentFilter),
            (401, r#"{"error":{"message":"Incorrect API key provided"}}"#, ErrorClass::Auth),
            (
                403,
                r#"{"type":"error","error":{"type":"permission_error","message":"no"}}"#,
                ErrorClass::PermissionDenied,
            ),
            (404, r#"{"error":"model 'llama9' not found"}"#, ErrorClass::NotFound),
            (408, "", ErrorClass::Timeout),
            (409, "", ErrorClass::Conflict),
            (413, r#"{"type":"error","error":{"type":"request_too_large"}}"#, ErrorClass::ContextLength),
            (429, r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#, ErrorClass::RateLimited),
            (429, r#"{"error":{"message":"too many tokens per minute"}}"#, ErrorClass::RateLimited),
            (
                429,
                r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}"#,
                ErrorClass::QuotaExceeded,
            ),
            (500, "oops", ErrorClass::Server),
            (502, "<html>bad gateway</html>", ErrorClass::Server),
            (503, "", ErrorClass::Overloaded),
            (
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                ErrorClass::Overloaded,
            ),
            (500, r#"{"type":"error","error":{"type":"overloaded_error"}}"#, ErrorClass::Overloaded),
            (418, "", ErrorClass::Other),
        ];
        for (status, text, expected) in table {
            assert_eq!(classify(*status, &body(text)), *expected, "{status} {text}");
        }
    }

    #[test]
    fn retryable_classes_are_the_transient_ones() {
        use ErrorClass::*;
        let all = [
            RateLimited,
            QuotaExceeded,
            Overloaded,
            Server,
            Timeout,
            Connection,
            Conflict,
            InvalidResponse,
            BadRequest,
            Auth,
            PermissionDenied,
            NotFound,
            ContextLength,
            ContentFilter,
            Other,
        ];
        let retryable: Vec<_> = all.into_iter().filter(|c| c.is_retryable()).collect();
        assert_eq!(
            retryable,
            [RateLimited, Overloaded, Server, Timeout, Connection, Conflict, InvalidResponse]
        );
        for class in all {
            assert!(!class.as_str().is_empty());
            assert!(class.http_status() >= 400);
        }
    }

    #[test]
    fn auth_errors_say_which_variable_to_set() {
        let key = KeySource::Env("OPENAI_API_KEY".into());
        let context = CallContext {
            provider: "openai",
            model: "gpt-4o-mini",
            url: "https://api.openai.com/v1",
            key: &key,
        };
        let err = upstream_error(
            context,
            401,
            &body(r#"{"error":{"message":"Incorrect API key provided: sk-...abc"}}"#),
            None,
        );
        assert_eq!(err.class, ErrorClass::Auth);
        assert_eq!(
            err.to_string(),
            "openai: 401 invalid API key (Incorrect API key provided: sk-...abc); set OPENAI_API_KEY in the \
             kernel's environment (or `api_key_env` for provider `openai` in keel.toml)"
        );
        let none = KeySource::None;
        let err = upstream_error(CallContext { key: &none, ..context }, 401, &ErrorBody::default(), None);
        assert!(err.message.contains("no API key is configured"), "{}", err.message);
    }

    #[test]
    fn rate_limit_messages_carry_the_wait() {
        let key = KeySource::None;
        let context = CallContext { provider: "local", model: "m", url: "http://x", key: &key };
        let err = upstream_error(context, 429, &ErrorBody::default(), Some(Duration::from_millis(1500)));
        assert_eq!(err.retry_after, Some(Duration::from_millis(1500)));
        assert!(err.message.contains("wait 1.5s"), "{}", err.message);
        assert!(Error::from(err).is_retryable());
    }

    #[test]
    fn error_bodies_parse_in_every_dialect() {
        assert_eq!(
            body(r#"{"error":{"message":"m","type":"t","code":"c"}}"#),
            ErrorBody { message: Some("m".into()), kind: Some("t".into()), code: Some("c".into()) }
        );
        assert_eq!(
            body(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
                .kind
                .as_deref(),
            Some("overloaded_error")
        );
        assert_eq!(body(r#"{"error":"plain"}"#).message.as_deref(), Some("plain"));
        assert_eq!(body("  not json ").message.as_deref(), Some("not json"));
        assert_eq!(body(""), ErrorBody::default());
    }
}
