//! The reversible mapping between kernel tool names and the names served over MCP.
//!
//! MCP tool names SHOULD use only `[A-Za-z0-9_.-]`. Names made only of those characters
//! (and without `-`) are served unchanged; `-` is the escape character: `-` becomes `--`, and
//! any other byte becomes `-` followed by two upper-case hex digits.

/// Whether `byte` may appear in a served tool name unescaped.
fn is_plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'.'
}

/// The MCP tool name under which the kernel tool `kernel_name` is served.
///
/// `fs.read` -> `fs.read`, `mcp:search` -> `mcp-3Asearch`, `a/b` -> `a-2Fb`,
/// `web-search` -> `web--search`. The inverse is [`kernel_name`].
pub fn served_name(kernel_name: &str) -> String {
    let mut served = String::with_capacity(kernel_name.len());
    for &byte in kernel_name.as_bytes() {
        if is_plain(byte) {
            served.push(char::from(byte));
        } else if byte == b'-' {
            served.push_str("--");
        } else {
            served.push_str(&format!("-{byte:02X}"));
        }
    }
    served
}

/// The kernel tool name that [`served_name`] maps to `served`, or `None` when `served` is not
/// something `served_name` produces (a stray character, a dangling or lower-case escape).
pub fn kernel_name(served: &str) -> Option<String> {
    let bytes = served.as_bytes();
    let mut kernel = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if is_plain(byte) {
            kernel.push(byte);
            index += 1;
        } else if byte == b'-' {
            match bytes.get(index + 1) {
                Some(b'-') => {
                    kernel.push(b'-');
                    index += 2;
                }
                Some(_) => {
                    let high = upper_hex_value(*bytes.get(index + 1)?)?;
                    let low = upper_hex_value(*bytes.get(index + 2)?)?;
                    let escaped = high << 4 | low;
                    // Only bytes that `served_name` escapes may appear escaped, so that every
                    // kernel name has exactly one served form.
                    if is_plain(escaped) || escaped == b'-' {
                        return None;
                    }
                    kernel.push(escaped);
                    index += 3;
                }
                None => return None,
            }
        } else {
            return None;
        }
    }
    String::from_utf8(kernel).ok()
}

fn upper_hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_and_underscored_names_are_served_unchanged() {
        for name in ["fs.read", "kv.get", "read_file", "Tool9", "a.b.c_d"] {
            assert_eq!(served_name(name), name);
            assert_eq!(kernel_name(name).as_deref(), Some(name));
        }
    }

    #[test]
    fn other_characters_are_escaped_reversibly() {
        let cases = [
            ("mcp:search", "mcp-3Asearch"),
            ("a/b", "a-2Fb"),
            ("web-search", "web--search"),
            ("x y", "x-20y"),
            ("é", "-C3-A9"),
            ("", ""),
        ];
        for (kernel, served) in cases {
            assert_eq!(served_name(kernel), served, "served_name({kernel:?})");
            assert_eq!(kernel_name(served).as_deref(), Some(kernel), "kernel_name({served:?})");
        }
    }

    #[test]
    fn served_names_use_only_the_spec_alphabet() {
        let served = served_name("srv:tool/with spaces,and-dashes.é");
        assert!(served.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)), "{served}");
    }

    #[test]
    fn names_served_name_cannot_produce_are_rejected() {
        for served in ["a-", "a-3", "a-3a", "a-2E", "a-2D", "a b", "a:b", "-FF"] {
            assert_eq!(kernel_name(served), None, "{served:?}");
        }
    }

    #[test]
    fn round_trip_holds_for_every_printable_ascii_pair() {
        for first in 0x20u8..0x7f {
            for second in 0x20u8..0x7f {
                let name = String::from_utf8(vec![first, second]).unwrap();
                assert_eq!(kernel_name(&served_name(&name)), Some(name));
            }
        }
    }
}
