//! The little of the DNS wire format (RFC 1035) the locked-mode resolver
//! needs: the header, the question, answer records (A, AAAA, CNAME decoded,
//! others skipped) and refusals built from a query.
//!
//! Hand-written rather than a crate: the resolver reads only these few
//! fields, and a full DNS library (hickory-proto, domain) would bring tens of
//! thousands of lines, async runtimes and features the sandbox could reach.
//! Everything here is bounds-checked and never panics on any input (see
//! `fuzz/fuzz_targets/dns_wire.rs`); name compression is followed only
//! backwards (each pointer strictly before the previous one), which rules
//! out loops, and names are limited to 255 bytes and 127 labels.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Record type A.
pub const TYPE_A: u16 = 1;
/// Record type CNAME.
pub const TYPE_CNAME: u16 = 5;
/// Record type AAAA.
pub const TYPE_AAAA: u16 = 28;
/// Class IN.
pub const CLASS_IN: u16 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 12;
/// Longest name on the wire (RFC 1035 2.3.4).
const MAX_WIRE_NAME: usize = 255;
/// At most this many labels in a name (255 bytes of 1-byte labels).
const MAX_LABELS: usize = 127;
/// At most this many answer records are looked at.
const MAX_ANSWERS: usize = 256;

/// Response codes used by the resolver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Rcode {
    /// No error.
    NoError = 0,
    /// The query could not be parsed.
    FormErr = 1,
    /// The upstream resolvers failed.
    ServFail = 2,
    /// The name does not exist.
    NxDomain = 3,
    /// Not a standard query.
    NotImp = 4,
    /// The policy refuses the name.
    Refused = 5,
}

/// Why a message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ends inside a field.
    #[error("message truncated")]
    Truncated,
    /// A compression pointer does not point strictly backwards.
    #[error("bad compression pointer")]
    BadPointer,
    /// A name is longer than 255 bytes or has too many labels.
    #[error("name too long")]
    NameTooLong,
    /// A label type other than a plain label or a pointer (RFC 6891's 0x40, 0x80).
    #[error("unsupported label type")]
    LabelType,
    /// A query without exactly one question.
    #[error("not exactly one question")]
    QuestionCount,
    /// A record's data length disagrees with its type.
    #[error("bad record data")]
    BadRecord,
}

/// The fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Transaction ID.
    pub id: u16,
    /// QR, opcode, AA, TC, RD, RA, Z, AD, CD, rcode.
    pub flags: u16,
    /// Question count.
    pub qdcount: u16,
    /// Answer count.
    pub ancount: u16,
    /// Authority count.
    pub nscount: u16,
    /// Additional count.
    pub arcount: u16,
}

impl Header {
    /// Reads the header.
    pub fn parse(bytes: &[u8]) -> Result<Header, WireError> {
        let field = |i: usize| -> Result<u16, WireError> {
            let pair = bytes.get(i..i + 2).ok_or(WireError::Truncated)?;
            Ok(u16::from_be_bytes([pair[0], pair[1]]))
        };
        Ok(Header { id: field(0)?, flags: field(2)?, qdcount: field(4)?, ancount: field(6)?, nscount: field(8)?, arcount: field(10)? })
    }

    /// Whether this is a response (QR set).
    pub fn is_response(&self) -> bool {
        self.flags & 0x8000 != 0
    }

    /// The opcode (0 is a standard query).
    pub fn opcode(&self) -> u8 {
        ((self.flags >> 11) & 0xf) as u8
    }

    /// The response code.
    pub fn rcode(&self) -> u8 {
        (self.flags & 0xf) as u8
    }

    /// Whether the message was truncated (TC set).
    pub fn truncated(&self) -> bool {
        self.flags & 0x0200 != 0
    }
}

/// The question of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name in presentation form, lower case, without the trailing dot
    /// (the root is ""); bytes other than letters, digits, `-` and `_` are
    /// written `\DDD`, so such names never match a rule.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// Offset just after the question in the message.
    pub end: usize,
}

/// Decoded record data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordData {
    /// An IPv4 address.
    A(Ipv4Addr),
    /// An IPv6 address.
    Aaaa(Ipv6Addr),
    /// A canonical name (presentation form as in [`Question::name`]).
    Cname(String),
    /// Anything else (not decoded).
    Other,
}

/// One resource record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Owner name (presentation form as in [`Question::name`]).
    pub name: String,
    /// TYPE.
    pub rtype: u16,
    /// CLASS.
    pub class: u16,
    /// TTL in seconds.
    pub ttl: u32,
    /// The data.
    pub data: RecordData,
}

impl Record {
    /// The address of an A or AAAA record.
    pub fn address(&self) -> Option<IpAddr> {
        match self.data {
            RecordData::A(address) => Some(IpAddr::V4(address)),
            RecordData::Aaaa(address) => Some(IpAddr::V6(address)),
            _ => None,
        }
    }
}

/// A parsed response: header, its one question, its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The header.
    pub header: Header,
    /// The question.
    pub question: Question,
    /// The answer section (at most 256 records are read).
    pub answers: Vec<Record>,
}

fn byte(bytes: &[u8], at: usize) -> Result<u8, WireError> {
    bytes.get(at).copied().ok_or(WireError::Truncated)
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, WireError> {
    Ok(u16::from_be_bytes([byte(bytes, at)?, byte(bytes, at + 1)?]))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, WireError> {
    Ok(u32::from_be_bytes([byte(bytes, at)?, byte(bytes, at + 1)?, byte(bytes, at + 2)?, byte(bytes, at + 3)?]))
}

/// Reads the name at `offset`; returns it and the offset after it (after
/// the first pointer, if the name is compressed).
pub fn read_name(bytes: &[u8], offset: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut at = offset;
    let mut end = None;
    let mut wire_len = 1;
    let mut labels = 0;
    // Every pointer must go strictly before the start of the part it ends.
    let mut limit = offset;
    loop {
        let length = byte(bytes, at)?;
        match length & 0xc0 {
            0x00 if length == 0 => {
                return Ok((name, end.unwrap_or(at + 1)));
            }
            0x00 => {
                let length = usize::from(length);
                let label = bytes.get(at + 1..at + 1 + length).ok_or(WireError::Truncated)?;
                wire_len += length + 1;
                labels += 1;
                if wire_len > MAX_WIRE_NAME || labels > MAX_LABELS {
                    return Err(WireError::NameTooLong);
                }
                if !name.is_empty() {
                    name.push('.');
                }
                for b in label {
                    match b {
                        b'A'..=b'Z' => name.push(char::from(b.to_ascii_lowercase())),
                        b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => name.push(char::from(*b)),
                        other => {
                            let _ = write!(name, "\\{other:03}");
                        }
                    }
                }
                at += 1 + length;
            }
            0xc0 => {
                let target = usize::from(u16_at(bytes, at)? & 0x3fff);
                if target >= limit {
                    return Err(WireError::BadPointer);
                }
                end.get_or_insert(at + 2);
                limit = target;
                at = target;
            }
            _ => return Err(WireError::LabelType),
        }
    }
}

/// Reads the question at offset 12.
fn read_question(bytes: &[u8]) -> Result<Question, WireError> {
    let (name, at) = read_name(bytes, HEADER_LEN)?;
    Ok(Question { name, qtype: u16_at(bytes, at)?, qclass: u16_at(bytes, at + 2)?, end: at + 4 })
}

/// Reads a query: its header and its one question (what follows, such as
/// an EDNS OPT record, is not looked at). The question's name must be
/// written out, without compression: nothing before it could be pointed
/// at but the header, whose bytes differ in the reply that echoes it.
pub fn parse_query(bytes: &[u8]) -> Result<(Header, Question), WireError> {
    let header = Header::parse(bytes)?;
    if header.qdcount != 1 {
        return Err(WireError::QuestionCount);
    }
    let question = read_question(bytes)?;
    let mut at = HEADER_LEN;
    while let Some(length) = bytes.get(at).copied().filter(|length| *length != 0) {
        if length & 0xc0 != 0 {
            return Err(WireError::BadPointer);
        }
        at += 1 + usize::from(length);
    }
    Ok((header, question))
}

/// Reads a response: header, its one question and the answer section.
pub fn parse_response(bytes: &[u8]) -> Result<Response, WireError> {
    let header = Header::parse(bytes)?;
    if header.qdcount != 1 {
        return Err(WireError::QuestionCount);
    }
    let question = read_question(bytes)?;
    let mut at = question.end;
    let mut answers = Vec::new();
    for _ in 0..usize::from(header.ancount).min(MAX_ANSWERS) {
        let (name, after) = read_name(bytes, at)?;
        let rtype = u16_at(bytes, after)?;
        let class = u16_at(bytes, after + 2)?;
        let ttl = u32_at(bytes, after + 4)?;
        let length = usize::from(u16_at(bytes, after + 8)?);
        let start = after + 10;
        let rdata = bytes.get(start..start + length).ok_or(WireError::Truncated)?;
        let data = match rtype {
            TYPE_A if class == CLASS_IN => {
                let octets: [u8; 4] = rdata.try_into().map_err(|_| WireError::BadRecord)?;
                RecordData::A(Ipv4Addr::from(octets))
            }
            TYPE_AAAA if class == CLASS_IN => {
                let octets: [u8; 16] = rdata.try_into().map_err(|_| WireError::BadRecord)?;
                RecordData::Aaaa(Ipv6Addr::from(octets))
            }
            TYPE_CNAME => {
                let (target, target_end) = read_name(bytes, start)?;
                if target_end != start + length {
                    return Err(WireError::BadRecord);
                }
                RecordData::Cname(target)
            }
            _ => RecordData::Other,
        };
        answers.push(Record { name, rtype, class, ttl, data });
        at = start + length;
    }
    Ok(Response { header, question, answers })
}

/// A response to `query` with `rcode` and no records: the query's ID, its
/// question section echoed (everything up to `question_end`; nothing when
/// `None`, e.g. for an unreadable question), QR and RA set, RD copied.
pub fn refusal(query: &[u8], question_end: Option<usize>, rcode: Rcode) -> Vec<u8> {
    let id = [query.first().copied().unwrap_or(0), query.get(1).copied().unwrap_or(0)];
    let (opcode_rd, question) = match query.get(2) {
        Some(flags) => (flags & 0x79, question_end.and_then(|end| query.get(HEADER_LEN..end))),
        None => (0, None),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + question.map_or(0, <[u8]>::len));
    out.extend(id);
    out.push(0x80 | opcode_rd);
    out.push(0x80 | rcode as u8);
    out.extend(u16::from(question.is_some()).to_be_bytes());
    out.extend([0; 6]);
    out.extend(question.unwrap_or_default());
    out
}

/// Encodes `name` (presentation form, plain labels only) as a wire name.
pub fn encode_name(name: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        if label.len() > 63 || label.contains('\\') {
            return None;
        }
        out.push(label.len() as u8);
        out.extend(label.as_bytes());
    }
    out.push(0);
    (out.len() <= MAX_WIRE_NAME).then_some(out)
}

/// A standard query for `name` and `qtype` (recursion desired), for tests
/// and the benchmark.
pub fn query(id: u16, name: &str, qtype: u16) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    out.extend(id.to_be_bytes());
    out.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    out.extend(encode_name(name)?);
    out.extend(qtype.to_be_bytes());
    out.extend(CLASS_IN.to_be_bytes());
    Some(out)
}

/// One answer record for [`answer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerRecord {
    /// Owner name.
    pub name: String,
    /// TTL in seconds.
    pub ttl: u32,
    /// A, AAAA or CNAME data.
    pub data: RecordData,
}

/// The largest reply sent over UDP to a client that did not offer a larger
/// size; the resolver does not read the sandbox's EDNS, so to every client.
pub const UDP_REPLY_MAX: usize = 512;

/// [`refusal`] with TC set: what a UDP client gets instead of a reply
/// longer than [`UDP_REPLY_MAX`], so that it asks again over TCP.
pub fn truncated(query: &[u8], question_end: usize, rcode: Rcode) -> Vec<u8> {
    let mut out = refusal(query, Some(question_end), rcode);
    out[2] |= 0x02;
    out
}

/// A response to `query` (a message [`parse_query`] accepts) with these
/// answers, uncompressed: the query's ID and question, QR and RA set, RD
/// copied, no other section. What the locked resolver sends the sandbox
/// (and the tests' fake upstream resolvers send).
pub fn answer(query: &[u8], rcode: Rcode, records: &[AnswerRecord]) -> Option<Vec<u8>> {
    let (_, question) = parse_query(query).ok()?;
    let mut out = refusal(query, Some(question.end), rcode);
    let count = u16::try_from(records.len()).ok()?;
    out[6..8].copy_from_slice(&count.to_be_bytes());
    for record in records {
        out.extend(encode_name(&record.name)?);
        let (rtype, data) = match &record.data {
            RecordData::A(address) => (TYPE_A, address.octets().to_vec()),
            RecordData::Aaaa(address) => (TYPE_AAAA, address.octets().to_vec()),
            RecordData::Cname(target) => (TYPE_CNAME, encode_name(target)?),
            RecordData::Other => return None,
        };
        out.extend(rtype.to_be_bytes());
        out.extend(CLASS_IN.to_be_bytes());
        out.extend(record.ttl.to_be_bytes());
        out.extend(u16::try_from(data.len()).ok()?.to_be_bytes());
        out.extend(data);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str, ttl: u32, address: &str) -> AnswerRecord {
        AnswerRecord { name: name.into(), ttl, data: RecordData::A(address.parse().expect("valid test input")) }
    }

    #[test]
    fn query_round_trip() {
        let bytes = query(0x1234, "Api.Example.COM", TYPE_AAAA).expect("encodable");
        let (header, question) = parse_query(&bytes).expect("parses");
        assert_eq!((header.id, header.is_response(), header.opcode()), (0x1234, false, 0));
        assert_eq!(question, Question { name: "api.example.com".into(), qtype: TYPE_AAAA, qclass: CLASS_IN, end: bytes.len() });
    }

    #[test]
    fn refusal_echoes_id_and_question() {
        let bytes = query(7, "evil.example", TYPE_A).expect("encodable");
        let (_, question) = parse_query(&bytes).expect("parses");
        let refused = refusal(&bytes, Some(question.end), Rcode::Refused);
        let header = Header::parse(&refused).expect("header");
        assert_eq!((header.id, header.is_response(), header.rcode(), header.qdcount, header.ancount), (7, true, 5, 1, 0));
        assert_eq!(&refused[HEADER_LEN..], &bytes[HEADER_LEN..]);
        // RD is copied, RA set.
        assert_eq!(refused[2] & 0x01, 1);
        assert_eq!(refused[3] & 0x80, 0x80);
        // Garbage still gets a well-formed answer.
        assert_eq!(refusal(&[1], None, Rcode::FormErr).len(), HEADER_LEN);
    }

    #[test]
    fn answers_with_cname_and_compression() {
        let q = query(9, "www.example.org", TYPE_A).expect("encodable");
        let records = [
            AnswerRecord { name: "www.example.org".into(), ttl: 300, data: RecordData::Cname("cdn.example.net".into()) },
            a("cdn.example.net", 60, "192.0.2.7"),
        ];
        let bytes = answer(&q, Rcode::NoError, &records).expect("encodable");
        let response = parse_response(&bytes).expect("parses");
        assert_eq!(response.answers.len(), 2);
        assert_eq!(response.answers[0].data, RecordData::Cname("cdn.example.net".into()));
        assert_eq!(response.answers[1].address(), Some("192.0.2.7".parse().expect("ip")));
        assert_eq!(response.answers[1].ttl, 60);

        // Hand-compressed: the answer's owner points at the question name (offset 12).
        let mut compressed = q.clone();
        compressed[7] = 1;
        compressed.extend([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 5]);
        let response = parse_response(&compressed).expect("parses");
        assert_eq!(response.answers[0].name, "www.example.org");
        assert_eq!(response.answers[0].address(), Some("203.0.113.5".parse().expect("ip")));
    }

    #[test]
    fn pointer_loops_and_forward_pointers_are_refused() {
        // A pointer to itself, and one pointing forwards.
        let mut looped = vec![0; HEADER_LEN];
        looped[5] = 1;
        looped.extend([0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(parse_query(&looped), Err(WireError::BadPointer));
        let mut forward = vec![0; HEADER_LEN];
        forward[5] = 1;
        forward.extend([0xc0, 14, 0, 0, 1, 0, 1]);
        assert_eq!(parse_query(&forward), Err(WireError::BadPointer));
        // Two pointers pointing at each other: the second is not strictly earlier.
        let mut pair = vec![0; HEADER_LEN];
        pair[5] = 1;
        pair.extend([1, b'a', 0xc0, 15, 0xc0, 12]);
        assert!(read_name(&pair, 14).is_err());
    }

    #[test]
    fn limits_and_truncation() {
        let mut long = vec![0; HEADER_LEN];
        long[5] = 1;
        for _ in 0..5 {
            long.push(63);
            long.extend([b'a'; 63]);
        }
        long.push(0);
        assert_eq!(parse_query(&long), Err(WireError::NameTooLong));
        let q = query(1, "a.example", TYPE_A).expect("encodable");
        for cut in 0..q.len() {
            assert!(parse_query(&q[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(read_name(&[0x40], 0), Err(WireError::LabelType));
        let bytes = answer(&q, Rcode::NoError, &[a("a.example", 5, "192.0.2.1")]).expect("encodable");
        for cut in q.len()..bytes.len() {
            assert!(parse_response(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // An A record with 5 bytes of data.
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 5] = 5;
        bad.push(0);
        assert_eq!(parse_response(&bad), Err(WireError::BadRecord));
    }

    #[test]
    fn a_compressed_question_is_no_query() {
        // The question's name points into the header.
        let mut bytes = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend([1, b'a', 0xc0, 4, 0, 1, 0, 1]);
        assert_eq!(parse_query(&bytes), Err(WireError::BadPointer));
        let q = query(1, "a.example", TYPE_A).expect("encodable");
        let (_, question) = parse_query(&q).expect("parses");
        let cut = truncated(&q, question.end, Rcode::NoError);
        let header = Header::parse(&cut).expect("header");
        assert!(header.truncated() && header.is_response() && header.ancount == 0);
        assert!(!Header::parse(&q).expect("header").truncated());
    }

    #[test]
    fn odd_bytes_are_escaped_so_no_rule_matches() {
        let mut bytes = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend([3, b'a', b'.', 0xff, 3, b'c', b'o', b'm', 0, 0, 1, 0, 1]);
        let (_, question) = parse_query(&bytes).expect("parses");
        assert_eq!(question.name, "a\\046\\255.com");
        assert!(crate::names::normalize_name(&question.name).is_err());
    }
}
