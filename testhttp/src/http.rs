//! HTTP/1.1 text, parsed from bytes and written to bytes: the request head, the `Range` and
//! `If-Match` headers, the routes, and the response head; no sockets here.

use std::ops::Range;

/// The most a request head may take (request line and headers); more is answered 431.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    /// The target as sent (origin form, query included).
    pub target: String,
    /// HTTP/1.0 closes after each answer unless asked to keep alive.
    pub http10: bool,
    /// Header names lowercased, values trimmed, in order.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The first value of header `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection stays open after the answer.
    pub(crate) fn keep_alive(&self) -> bool {
        let connection = self.header("connection").map(str::to_ascii_lowercase);
        match connection.as_deref() {
            Some(v) if v.contains("close") => false,
            Some(v) if v.contains("keep-alive") => true,
            _ => !self.http10,
        }
    }

    /// The body length the client announced (bodies are read and dropped).
    pub(crate) fn content_length(&self) -> Result<u64, HeadError> {
        match self.header("content-length") {
            None => Ok(0),
            Some(v) => v.parse().map_err(|_| HeadError::Malformed),
        }
    }
}

/// Why a request head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Not HTTP/1.x text.
    Malformed,
    /// Longer than [`MAX_HEAD`].
    TooLarge,
}

/// Finds the end of a request head in `buf`: the index just past the empty line.
pub(crate) fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses a request head (up to and including its empty line).
pub(crate) fn parse_head(head: &[u8]) -> Result<Request, HeadError> {
    if head.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed)?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().ok_or(HeadError::Malformed)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed);
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(HeadError::Malformed),
    };
    if method.is_empty() || !target.starts_with('/') {
        return Err(HeadError::Malformed);
    }
    let mut headers = Vec::new();
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(HeadError::Malformed)?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(HeadError::Malformed);
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Request {
        method: method.to_owned(),
        target: target.to_owned(),
        http10,
        headers,
    })
}

/// What a `Range` header asks of an object of `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeAsk {
    /// No usable range (absent, not `bytes=`, malformed, or several ranges): the whole object.
    Whole,
    /// One satisfiable range, clamped to the object.
    Part(Range<u64>),
    /// One range starting at or past the end (or a zero suffix): 416.
    Unsatisfiable,
}

/// Reads a `Range` header value against an object of `len` bytes (RFC 9110, 14.1.2: a
/// server may ignore a range it does not support, so multi-ranges get the whole object).
pub(crate) fn parse_range(value: Option<&str>, len: u64) -> RangeAsk {
    let Some(spec) = value.and_then(|v| v.trim().strip_prefix("bytes=")) else {
        return RangeAsk::Whole;
    };
    if spec.contains(',') {
        return RangeAsk::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAsk::Whole;
    };
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            s.parse().ok()
        }
    };
    match (first.is_empty(), last.is_empty()) {
        // bytes=-N: the last N bytes.
        (true, false) => match number(last) {
            Some(0) => RangeAsk::Unsatisfiable,
            Some(_) if len == 0 => RangeAsk::Unsatisfiable,
            Some(n) => RangeAsk::Part(len.saturating_sub(n)..len),
            None => RangeAsk::Whole,
        },
        // bytes=A-: from A to the end.
        (false, true) => match number(first) {
            Some(a) if a >= len => RangeAsk::Unsatisfiable,
            Some(a) => RangeAsk::Part(a..len),
            None => RangeAsk::Whole,
        },
        (false, false) => match (number(first), number(last)) {
            (Some(a), Some(b)) if a > b => RangeAsk::Whole,
            (Some(a), Some(_)) if a >= len => RangeAsk::Unsatisfiable,
            (Some(a), Some(b)) => RangeAsk::Part(a..b.saturating_add(1).min(len)),
            _ => RangeAsk::Whole,
        },
        (true, true) => RangeAsk::Whole,
    }
}

/// Whether an `If-Match` header lets a request on an object whose strong ETag is `etag`
/// (quoted) through: absent, `*`, or a list naming it (RFC 9110, 13.1.1; weak tags never
/// match).
pub(crate) fn if_match_passes(value: Option<&str>, etag: &str) -> bool {
    let Some(value) = value else {
        return true;
    };
    value
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag == etag)
}

/// Where a request target leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// The hub's `/{org}/{repo}/resolve/{revision}/{path}`.
    Hub {
        repo: String,
        revision: String,
        path: String,
    },
    /// The hub API's `/api/models/{org}/{repo}/revision/{revision}` (a repository at a
    /// revision, with its files) and `/api/models/{org}/{repo}/tree/{revision}` (its
    /// files, with their sizes and digests): what `huggingface_hub`'s `snapshot_download`
    /// asks before it downloads.
    Api {
        repo: String,
        revision: String,
        /// The tree rather than the revision.
        tree: bool,
    },
    /// `/{path}` of the static tree.
    Static { path: String },
}

/// Maps a target to a route, its path decoded and confined to the served tree: `None` for
/// `..`, empty names, a NUL or a bad escape (answered 404, as any missing file).
pub(crate) fn route(target: &str) -> Option<Route> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let segments: Vec<String> = path
        .strip_prefix('/')?
        .split('/')
        .map(percent_decode)
        .collect::<Option<_>>()?;
    let clean = |parts: &[String]| -> Option<String> {
        let ok = !parts.is_empty()
            && parts
                .iter()
                .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains(['\0', '/', '\\']));
        ok.then(|| parts.join("/"))
    };
    if segments.len() >= 6
        && segments[0] == "api"
        && segments[1] == "models"
        && (segments[4] == "revision" || segments[4] == "tree")
    {
        let revision = segments[5].clone();
        if revision.is_empty() || revision.contains('\0') {
            return None;
        }
        return Some(Route::Api {
            repo: clean(&segments[2..4])?,
            revision,
            tree: segments[4] == "tree",
        });
    }
    if segments.len() >= 5 && segments[2] == "resolve" {
        // A revision may be a branch with a slash, sent escaped (`refs%2Fpr%2F1`).
        let revision = segments[3].clone();
        if revision.is_empty() || revision.contains('\0') {
            return None;
        }
        return Some(Route::Hub {
            repo: clean(&segments[..2])?,
            revision,
            path: clean(&segments[4..])?,
        });
    }
    Some(Route::Static {
        path: clean(&segments)?,
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The static route's target of a confined path, each segment percent-encoded (all but
/// RFC 3986's unreserved characters).
pub(crate) fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 1);
    for segment in path.split('/') {
        out.push('/');
        for b in segment.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// The host a redirect to "the CDN" names: this server by the other name of loopback
/// (`localhost` for `127.0.0.1` and back), so that a client sees another host; any other
/// host as it is.
pub(crate) fn cdn_host(host: &str) -> String {
    if let Some(port) = host.strip_prefix("127.0.0.1") {
        format!("localhost{port}")
    } else if let Some(port) = host.strip_prefix("localhost") {
        format!("127.0.0.1{port}")
    } else {
        host.to_owned()
    }
}

/// A response head: the status line, the headers given, and `Content-Length`.
pub(crate) fn response_head(
    status: u16,
    headers: &[(&str, String)],
    content_length: u64,
    keep_alive: bool,
) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {content_length}\r\n"));
    head.push_str(if keep_alive {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    head.into_bytes()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        412 => "Precondition Failed",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_bad_ones_are_refused() {
        let req =
            parse_head(b"GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nRange:  bytes=0-9 \r\n\r\n").unwrap();
        assert_eq!(req.method, "GET");
        assert_eq!(req.target, "/a/b?x=1");
        assert_eq!(req.header("range"), Some("bytes=0-9"));
        assert!(req.keep_alive());
        let old = parse_head(b"HEAD / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!old.keep_alive());
        let closing = parse_head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!closing.keep_alive());
        for bad in [
            &b"GET /\r\n\r\n"[..],
            b"GET / HTTP/2\r\n\r\n",
            b"GET a HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"\xff / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse_head(bad), Err(HeadError::Malformed), "{bad:?}");
        }
        assert_eq!(
            parse_head(&vec![b'a'; MAX_HEAD + 1]),
            Err(HeadError::TooLarge)
        );
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn ranges_follow_rfc_9110() {
        use RangeAsk::*;
        let r = |v: &str, len| parse_range(Some(v), len);
        assert_eq!(parse_range(None, 10), Whole);
        assert_eq!(r("bytes=0-0", 10), Part(0..1));
        assert_eq!(r("bytes=2-5", 10), Part(2..6));
        assert_eq!(r("bytes=2-500", 10), Part(2..10));
        assert_eq!(r("bytes=7-", 10), Part(7..10));
        assert_eq!(r("bytes=-3", 10), Part(7..10));
        assert_eq!(r("bytes=-30", 10), Part(0..10));
        assert_eq!(r("bytes=10-", 10), Unsatisfiable);
        assert_eq!(r("bytes=10-20", 10), Unsatisfiable);
        assert_eq!(r("bytes=-0", 10), Unsatisfiable);
        assert_eq!(r("bytes=0-", 0), Unsatisfiable);
        assert_eq!(r("bytes=-5", 0), Unsatisfiable);
        for ignored in [
            "bytes=5-2",
            "bytes=0-1,4-5",
            "items=0-1",
            "bytes=a-b",
            "bytes=-",
            "bytes=+1-2",
        ] {
            assert_eq!(r(ignored, 10), Whole, "{ignored}");
        }
    }

    #[test]
    fn if_match_needs_the_strong_tag() {
        assert!(if_match_passes(None, "\"a\""));
        assert!(if_match_passes(Some("*"), "\"a\""));
        assert!(if_match_passes(Some("\"b\", \"a\""), "\"a\""));
        assert!(!if_match_passes(Some("\"b\""), "\"a\""));
        assert!(!if_match_passes(Some("W/\"a\""), "\"a\""));
    }

    #[test]
    fn routes_are_decoded_and_confined() {
        assert_eq!(
            route("/org/repo/resolve/main/sub/model.safetensors?download=true"),
            Some(Route::Hub {
                repo: "org/repo".into(),
                revision: "main".into(),
                path: "sub/model.safetensors".into(),
            })
        );
        assert_eq!(
            route("/org/repo/resolve/refs%2Fpr%2F1/a%20b"),
            Some(Route::Hub {
                repo: "org/repo".into(),
                revision: "refs/pr/1".into(),
                path: "a b".into(),
            })
        );
        assert_eq!(
            route("/dir/model.safetensors"),
            Some(Route::Static {
                path: "dir/model.safetensors".into()
            })
        );
        for bad in [
            "/",
            "/../etc/passwd",
            "/a/../../b",
            "/a//b",
            "/a/%2e%2e/b",
            "/a%2Fb",
            "/a/%zz",
            "/org/repo/resolve/main/../x",
            "/api/models/../repo/revision/main",
        ] {
            assert_eq!(route(bad), None, "{bad}");
        }
        assert_eq!(
            route("/api/models/org/repo/revision/refs%2Fpr%2F1"),
            Some(Route::Api {
                repo: "org/repo".into(),
                revision: "refs/pr/1".into(),
                tree: false,
            })
        );
        assert_eq!(
            route("/api/models/org/repo/tree/main?recursive=True&expand=False"),
            Some(Route::Api {
                repo: "org/repo".into(),
                revision: "main".into(),
                tree: true,
            })
        );
    }

    #[test]
    fn redirects_name_loopback_by_its_other_name() {
        assert_eq!(cdn_host("127.0.0.1:8080"), "localhost:8080");
        assert_eq!(cdn_host("localhost:8080"), "127.0.0.1:8080");
        assert_eq!(cdn_host("hub.example"), "hub.example");
    }

    #[test]
    fn encoded_paths_route_back_to_themselves() {
        for path in ["a", "sub/model.safetensors", "a b/ü%x"] {
            let target = encode_path(path);
            assert_eq!(route(&target), Some(Route::Static { path: path.into() }));
        }
        assert_eq!(encode_path("a b/c"), "/a%20b/c");
    }

    #[test]
    fn response_heads_end_with_length_and_connection() {
        let head = response_head(206, &[("ETag", "\"x\"".into())], 5, true);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 206 Partial Content\r\nETag: \"x\"\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n"
        );
    }
}
