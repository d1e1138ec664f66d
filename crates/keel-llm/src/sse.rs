//! An incremental server-sent-events decoder (the WHATWG event-stream format): bytes in,
//! whole events out, however the bytes were split into chunks. Pure, so the split
//! independence is property-tested.

/// One dispatched event. `event` is the `event:` field (None means the default `message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of the line being read (no terminator yet).
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` starting the next one ends nothing.
    after_cr: bool,
    /// Whether the first line was seen (a leading byte-order mark is dropped).
    started: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// Feeds the next bytes; returns the events they complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in bytes {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut events);
                }
                b'\n' => self.end_line(&mut events),
                _ => self.line.push(byte),
            }
        }
        events
    }

    /// The stream ended: an event still missing its blank line is dispatched anyway (some
    /// servers omit the last one).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.end_line(&mut events);
        events.pop()
    }

    fn end_line(&mut self, events: &mut Vec<SseEvent>) {
        let mut line = std::mem::take(&mut self.line);
        if !self.started {
            self.started = true;
            if line.starts_with("\u{feff}".as_bytes()) {
                line.drain(..3);
            }
        }
        if line.is_empty() {
            if self.has_data {
                events.push(SseEvent { event: self.event.take(), data: std::mem::take(&mut self.data) });
            }
            self.event = None;
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return; // a comment (keep-alive)
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*text, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // `id`, `retry` and unknown fields do not matter to LLM streams
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut decoder = SseDecoder::new();
        let mut events: Vec<SseEvent> = chunks.iter().flat_map(|chunk| decoder.feed(chunk)).collect();
        events.extend(decoder.finish());
        events
    }

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent { event: name.map(str::to_owned), data: data.to_owned() }
    }

    const SAMPLE: &str = "\u{feff}: keep-alive\r\n\
        event: message_start\r\ndata: {\"a\":1}\r\n\r\n\
        data: line one\ndata:line two\n\n\
        event: ping\ndata: {}\n\n\
        id: 7\nretry: 100\n\n\
        data\n\n\
        event: lonely\n\n\
        data: [DONE]\r\r\
        data: unterminated";

    #[test]
    fn decodes_fields_terminators_comments_and_a_missing_final_blank_line() {
        assert_eq!(
            decode_all(&[SAMPLE.as_bytes()]),
            vec![
                event(Some("message_start"), "{\"a\":1}"),
                event(None, "line one\nline two"),
                event(Some("ping"), "{}"),
                event(None, ""),
                event(None, "[DONE]"),
                event(None, "unterminated"),
            ]
        );
    }

    #[test]
    fn utf8_split_across_chunks_survives() {
        let text = "data: héllo ✓\n\n".as_bytes();
        for split in 0..text.len() {
            assert_eq!(decode_all(&[&text[..split], &text[split..]]), vec![event(None, "héllo ✓")]);
        }
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_events(cuts in proptest::collection::vec(0usize..=SAMPLE.len(), 0..12)) {
            let bytes = SAMPLE.as_bytes();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&bytes[start..cut]);
                start = cut;
            }
            chunks.push(&bytes[start..]);
            prop_assert_eq!(decode_all(&chunks), decode_all(&[bytes]));
        }
    }
}
