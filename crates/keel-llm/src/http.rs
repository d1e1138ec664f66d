//! The HTTP edge shared by the providers: building the client (rustls; connect and
//! per-read timeouts), posting a JSON body, turning transport failures and error answers
//! into classified [`UpstreamError`]s, feeding rate-limit headers to the limiter, and
//! reading a response as JSON or as server-sent events.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::config::HttpConfig;
use crate::error::{
    CallContext, Error, ErrorBody, ErrorClass, KeySource, Result, UpstreamError, human, upstream_error,
};
use crate::ratelimit::{RateLimitInfo, RateLimiter};
use crate::sse::{SseDecoder, SseEvent};

pub(crate) fn build_client(http: &HttpConfig) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_millis(http.connect_timeout_ms))
        .read_timeout(Duration::from_millis(http.read_timeout_ms))
        .build()
        .map_err(|e| Error::Config(format!("cannot set up the HTTP client: {}", chain(&e))))
}

/// A provider's endpoint: where to post, with which headers.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub provider: String,
    pub url: String,
    /// `url` parsed once, not on every call (URL parsing with its IDNA pass showed in the
    /// gateway's profile); `None` for a URL that does not parse, which then fails each
    /// call as a transport error naming it.
    parsed: Option<reqwest::Url>,
    pub client: reqwest::Client,
    pub headers: HeaderMap,
    pub key_source: KeySource,
    pub read_timeout: Duration,
}

impl Endpoint {
    pub fn new(
        provider: &str,
        url: String,
        client: reqwest::Client,
        fixed: Vec<(String, String)>,
        extra: &BTreeMap<String, String>,
        key_source: KeySource,
        read_timeout: Duration,
    ) -> Result<Endpoint> {
        let mut headers = HeaderMap::new();
        for (name, value) in fixed
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain(extra.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::Config(format!("provider `{provider}`: {name:?} is not a valid header name"))
            })?;
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                Error::Config(format!("provider `{provider}`: the value of header {name:?} is not valid (API keys must be plain ASCII)"))
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let parsed = reqwest::Url::parse(&url).ok();
        Ok(Endpoint { provider: provider.to_owned(), url, parsed, client, headers, key_source, read_timeout })
    }

    pub fn context<'a>(&'a self, model: &'a str) -> CallContext<'a> {
        CallContext { provider: &self.provider, model, url: &self.url, key: &self.key_source }
    }

    /// Posts `body`. A 2xx is returned with its rate-limit headers already learned; any
    /// other answer becomes a classified error (its headers learned too).
    pub async fn post<B: serde::Serialize + ?Sized>(
        &self,
        body: &B,
        model: &str,
        limiter: &RateLimiter,
    ) -> Result<reqwest::Response, UpstreamError> {
        let request = match &self.parsed {
            Some(url) => self.client.post(url.clone()),
            None => self.client.post(&self.url),
        };
        let response = request
            .headers(self.headers.clone())
            .json(body)
            .send()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = response.status().as_u16();
        let info = RateLimitInfo::from_headers(response.headers(), SystemTime::now());
        limiter.observe(model, &info, status == 429);
        if response.status().is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let error = upstream_error(self.context(model), status, &ErrorBody::parse(&text), info.retry_after);
        tracing::debug!(provider = %self.provider, status, class = error.class.as_str(), "upstream error");
        Err(error)
    }

    pub fn transport_error(&self, error: &reqwest::Error) -> UpstreamError {
        let (class, message) = if error.is_timeout() {
            (
                ErrorClass::Timeout,
                format!(
                    "no answer from {} within {} ({}); raise [llm.http] read_timeout_ms in keel.toml if the model is just slow",
                    self.url,
                    human(self.read_timeout),
                    chain(error)
                ),
            )
        } else if error.is_connect() {
            (
                ErrorClass::Connection,
                format!(
                    "could not connect to {} ({}); check the provider's base_url (or OPENAI_BASE_URL / ANTHROPIC_BASE_URL) and that the server is up",
                    self.url,
                    chain(error)
                ),
            )
        } else {
            (ErrorClass::Connection, format!("the connection to {} failed ({})", self.url, chain(error)))
        };
        UpstreamError::new(&self.provider, class, message)
    }

    pub fn invalid_response(&self, detail: impl std::fmt::Display) -> UpstreamError {
        UpstreamError::new(
            &self.provider,
            ErrorClass::InvalidResponse,
            format!("the answer from {} is not what the API specifies: {detail}", self.url),
        )
    }

    /// Reads a whole 2xx body as JSON.
    pub async fn read_json(&self, response: reqwest::Response) -> Result<Value, UpstreamError> {
        let bytes = self.read_body(response).await?;
        serde_json::from_slice(&bytes).map_err(|e| self.invalid_response(format!("not JSON ({e})")))
    }

    /// Reads a whole 2xx body.
    pub async fn read_body(
        &self,
        response: reqwest::Response,
    ) -> Result<impl std::ops::Deref<Target = [u8]> + use<>, UpstreamError> {
        response.bytes().await.map_err(|e| self.transport_error(&e))
    }
}

/// Reads server-sent events off a response, chunk by chunk.
pub(crate) struct EventReader {
    response: reqwest::Response,
    decoder: SseDecoder,
    pending: std::collections::VecDeque<SseEvent>,
    ended: bool,
}

impl EventReader {
    pub fn new(response: reqwest::Response) -> EventReader {
        EventReader { response, decoder: SseDecoder::new(), pending: Default::default(), ended: false }
    }

    /// The next event; `None` once the stream has ended.
    pub async fn next(&mut self, endpoint: &Endpoint) -> Result<Option<SseEvent>, UpstreamError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            match self.response.chunk().await.map_err(|e| endpoint.transport_error(&e))? {
                Some(bytes) => self.pending.extend(self.decoder.feed(&bytes)),
                None => {
                    self.ended = true;
                    self.pending.extend(self.decoder.finish());
                }
            }
        }
    }
}

/// An error and its sources, for messages (reqwest's own text omits the cause).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    // reqwest's own line only repeats the URL the message already names.
    if text.starts_with("error sending request for url")
        && let Some(cause) = source
    {
        text = cause.to_string();
        source = cause.source();
    }
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The error for a stream that stopped before its end marker.
pub(crate) fn truncated(endpoint: &Endpoint) -> UpstreamError {
    UpstreamError::new(
        &endpoint.provider,
        ErrorClass::Connection,
        format!("the response stream from {} ended before the response was complete", endpoint.url),
    )
}
