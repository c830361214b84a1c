//! The crate's one nf_tables codec: netlink messages of the nf_tables
//! subsystem built attribute by attribute (tables, chains, rules with
//! every expression the crate uses, sets, set elements with timeouts),
//! batches (`NFNL_MSG_BATCH_BEGIN` ... `_END`, one transaction), the
//! parsing of what the kernel sends back, and the netfilter netlink
//! socket that sends, checks acknowledgements and dumps.
//!
//! Pure Rust (no libnftnl/libmnl), and a leaf: it uses nothing else of
//! the crate; `nft`, `nat`, `nftset` and `refused` say *what* to install
//! and use it for *how*. Attribute order follows libnftnl's (which nft
//! sends too); the kernel parses attributes by type, in any order. The
//! unit tests compare the bytes with those libnftnl produced before.
//!
//! Numbers are from linux/netfilter/nf_tables.h, nfnetlink.h and
//! linux/netlink.h. Every function that talks to the kernel talks to the
//! calling thread's network namespace.

use std::io;

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use rtnetlink::sys::Socket;
use rtnetlink::sys::protocols::NETLINK_NETFILTER;

// ---- numbers ----

pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const fn nft_msg(kind: u16) -> u16 {
    NFNL_SUBSYS_NFTABLES << 8 | kind
}
pub(crate) const NFT_MSG_NEWTABLE: u16 = nft_msg(0);
pub(crate) const NFT_MSG_GETTABLE: u16 = nft_msg(1);
pub(crate) const NFT_MSG_DELTABLE: u16 = nft_msg(2);
pub(crate) const NFT_MSG_NEWCHAIN: u16 = nft_msg(3);
pub(crate) const NFT_MSG_GETCHAIN: u16 = nft_msg(4);
pub(crate) const NFT_MSG_DELCHAIN: u16 = nft_msg(5);
pub(crate) const NFT_MSG_NEWRULE: u16 = nft_msg(6);
pub(crate) const NFT_MSG_GETRULE: u16 = nft_msg(7);
pub(crate) const NFT_MSG_NEWSET: u16 = nft_msg(9);
pub(crate) const NFT_MSG_GETSET: u16 = nft_msg(10);
pub(crate) const NFT_MSG_NEWSETELEM: u16 = nft_msg(12);
pub(crate) const NFT_MSG_GETSETELEM: u16 = nft_msg(13);
pub(crate) const NFT_MSG_DELSETELEM: u16 = nft_msg(14);

const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// `NLM_F_ROOT | NLM_F_MATCH`.
const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
/// A new rule goes after the chain's others.
pub(crate) const NLM_F_APPEND: u16 = 0x800;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
/// `NLM_F_DUMP_INTR`: the dump changed under the kernel's hands.
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HEADER: usize = 16;
const NFGENMSG: usize = 4;

/// `NFPROTO_*` families.
pub(crate) const NFPROTO_UNSPEC: u8 = 0;
pub(crate) const NFPROTO_INET: u8 = 1;
pub(crate) const NFPROTO_IPV4: u8 = 2;
pub(crate) const NFPROTO_IPV6: u8 = 10;

/// Hooks (`NF_INET_*`).
pub(crate) const NF_INET_PRE_ROUTING: u32 = 0;
pub(crate) const NF_INET_FORWARD: u32 = 2;
pub(crate) const NF_INET_POST_ROUTING: u32 = 4;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// `NFT_GOTO` (-4).
const NFT_GOTO: u32 = -4i32 as u32;

/// Registers: the verdict register, the 16-byte ones and the 4-byte ones
/// (`NFT_REG32_00` is the first; 12 of them make the 16-byte `NFT_REG_2`).
const NFT_REG_VERDICT: u32 = 0;
pub(crate) const NFT_REG_1: u32 = 1;
pub(crate) const NFT_REG_2: u32 = 2;
pub(crate) const NFT_REG32_00: u32 = 8;

pub(crate) const NFT_META_IIFNAME: u32 = 6;
pub(crate) const NFT_META_OIFNAME: u32 = 7;
pub(crate) const NFT_META_NFPROTO: u32 = 15;
pub(crate) const NFT_META_L4PROTO: u32 = 16;
pub(crate) const NFT_CT_STATE: u32 = 0;
pub(crate) const NFT_CMP_EQ: u32 = 0;
pub(crate) const NFT_CMP_NEQ: u32 = 1;
pub(crate) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub(crate) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub(crate) const NFT_FIB_RESULT_OIF: u32 = 1;
pub(crate) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub(crate) const NFTA_FIB_F_DADDR: u32 = 2;
pub(crate) const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub(crate) const NFT_REJECT_ICMPX_UNREACH: u32 = 2;
pub(crate) const NFT_REJECT_ICMPX_HOST_UNREACH: u8 = 2;

/// Set flags: `timeout` and `dynamic` (`NFT_SET_EVAL`); `constant`,
/// `interval` and `map`.
pub(crate) const NFT_SET_CONSTANT: u32 = 0x2;
pub(crate) const NFT_SET_INTERVAL: u32 = 0x4;
pub(crate) const NFT_SET_MAP: u32 = 0x8;
pub(crate) const NFT_SET_TIMEOUT: u32 = 0x10;
pub(crate) const NFT_SET_EVAL: u32 = 0x20;

/// `NFTNL_UDATA_RULE_COMMENT`, and libnftnl's room for a rule's user data
/// (`NFTNL_UDATA_COMMENT_MAXLEN`: type, length and value of the comment).
const UDATA_RULE_COMMENT: u8 = 0;
const UDATA_COMMENT_MAXLEN: usize = 128;

// ---- attributes ----

/// One netlink attribute: length, type, value, zero padding to 4 bytes.
pub(crate) fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + value.len() + 3);
    out.extend(((4 + value.len()) as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize((out.len() + 3) & !3, 0);
    out
}

/// An attribute holding attributes (`NLA_F_NESTED` set, as libnftnl does).
pub(crate) fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
    attr(kind | NLA_F_NESTED, inner)
}

/// A string with its NUL, as nf_tables names are sent.
pub(crate) fn strz(text: &str) -> Vec<u8> {
    [text.as_bytes(), &[0]].concat()
}

/// A 32-bit attribute (network byte order, like every nf_tables number).
fn be32(kind: u16, value: u32) -> Vec<u8> {
    attr(kind, &value.to_be_bytes())
}

/// `NFTA_DATA_VALUE` in a nested data attribute.
fn data(kind: u16, value: &[u8]) -> Vec<u8> {
    nested(kind, &attr(1, value))
}

// ---- expressions ----

/// A verdict of an `immediate` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    Drop,
    /// `goto CHAIN`.
    Goto(String),
}

/// One expression of a rule. Values compared with or loaded are the bytes
/// the register holds: addresses, ports in network order, the kernel's
/// own numbers (ct state, interface index) in host order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    /// `meta KEY` into `dreg`.
    Meta { key: u32, dreg: u32 },
    /// Register 1 compared with `value` (`op`: `NFT_CMP_EQ`/`_NEQ`).
    Cmp { op: u32, value: Vec<u8> },
    /// `len` bytes at `offset` of header `base` into `dreg`.
    Payload { base: u32, offset: u32, len: u32, dreg: u32 },
    /// Register 1 = (register 1 & mask) ^ xor, over `mask.len()` bytes.
    Bitwise { mask: Vec<u8>, xor: Vec<u8> },
    /// `ct KEY` into register 1.
    Ct { key: u32 },
    /// Register 1 looked up in the named set (of the rule's table).
    Lookup { set: String },
    /// `value` into `dreg`.
    Immediate { dreg: u32, value: Vec<u8> },
    /// A verdict (an `immediate` into the verdict register).
    Verdict(Verdict),
    /// `masquerade`.
    Masquerade,
    /// `update @SET { key from register `sreg` }` (`op`: `NFT_DYNSET_OP_*`).
    Dynset { set: String, op: u32, sreg: u32 },
    /// `fib daddr RESULT` (`flags`: `NFTA_FIB_F_*`) into register 1.
    Fib { result: u32, flags: u32 },
    /// `reject with TYPE CODE`.
    Reject { kind: u32, code: u8 },
    /// `counter` (as a set's per-element expression).
    Counter,
}

impl Expr {
    /// The expression's name and `NFTA_EXPR_DATA` attributes.
    fn name_and_data(&self) -> (&'static str, Vec<u8>) {
        match self {
            Expr::Meta { key, dreg } => ("meta", [be32(2, *key), be32(1, *dreg)].concat()),
            Expr::Cmp { op, value } => ("cmp", [be32(1, NFT_REG_1), be32(2, *op), data(3, value)].concat()),
            Expr::Payload { base, offset, len, dreg } => {
                ("payload", [be32(1, *dreg), be32(2, *base), be32(3, *offset), be32(4, *len)].concat())
            }
            Expr::Bitwise { mask, xor } => {
                ("bitwise", [be32(1, NFT_REG_1), be32(2, NFT_REG_1), be32(3, mask.len() as u32), data(4, mask), data(5, xor)].concat())
            }
            Expr::Ct { key } => ("ct", [be32(2, *key), be32(1, NFT_REG_1)].concat()),
            // The set ID (4) is 0: the kernel finds the set by its name.
            Expr::Lookup { set } => ("lookup", [be32(2, NFT_REG_1), attr(1, &strz(set)), be32(4, 0)].concat()),
            Expr::Immediate { dreg, value } => ("immediate", [be32(1, *dreg), data(2, value)].concat()),
            Expr::Verdict(verdict) => {
                let verdict = match verdict {
                    Verdict::Accept => be32(1, NF_ACCEPT),
                    Verdict::Drop => be32(1, NF_DROP),
                    Verdict::Goto(chain) => [be32(1, NFT_GOTO), attr(2, &strz(chain))].concat(),
                };
                // NFTA_IMMEDIATE_DATA { NFTA_DATA_VERDICT { code, chain } }.
                ("immediate", [be32(1, NFT_REG_VERDICT), nested(2, &nested(2, &verdict))].concat())
            }
            Expr::Masquerade => ("masq", Vec::new()),
            Expr::Dynset { set, op, sreg } => ("dynset", [attr(1, &strz(set)), be32(3, *op), be32(4, *sreg)].concat()),
            Expr::Fib { result, flags } => ("fib", [be32(1, NFT_REG_1), be32(2, *result), be32(3, *flags)].concat()),
            Expr::Reject { kind, code } => ("reject", [be32(1, *kind), attr(2, &[*code])].concat()),
            Expr::Counter => ("counter", Vec::new()),
        }
    }

    /// The expression as attribute `kind`: `{ NFTA_EXPR_NAME, NFTA_EXPR_DATA }`.
    fn encode(&self, kind: u16) -> Vec<u8> {
        let (name, data) = self.name_and_data();
        nested(kind, &[attr(1, &strz(name)), nested(2, &data)].concat())
    }
}

/// The expressions as the elements of an `NFTA_RULE_EXPRESSIONS` list.
pub(crate) fn expressions(list: &[Expr]) -> Vec<u8> {
    list.iter().flat_map(|e| e.encode(1)).collect()
}

// ---- message payloads (nfgenmsg follows the header; these follow it) ----

/// `NFT_MSG_NEWTABLE`/`_DELTABLE`: the name, and with `flags` the table flags.
pub(crate) fn table(name: &str, flags: Option<u32>) -> Vec<u8> {
    let mut out = attr(1, &strz(name));
    out.extend(flags.map(|f| be32(2, f)).unwrap_or_default());
    out
}

/// What makes a chain a base chain: its hook, priority and type; the
/// policy is always accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub hook: u32,
    pub priority: i32,
    /// `filter` or `nat`.
    pub kind: &'static str,
}

/// `NFT_MSG_NEWCHAIN`/`_DELCHAIN`: a regular chain, or a base chain.
pub(crate) fn chain(table: &str, name: &str, base: Option<BaseChain>) -> Vec<u8> {
    let mut out = [attr(1, &strz(table)), attr(3, &strz(name))].concat();
    if let Some(base) = base {
        out.extend(nested(4, &[be32(1, base.hook), be32(2, base.priority as u32)].concat()));
        out.extend(be32(5, NF_ACCEPT));
        out.extend(attr(7, &strz(base.kind)));
    }
    out
}

/// `NFT_MSG_NEWRULE`: the rule's expressions in `table`/`chain`.
pub(crate) fn rule(table: &str, chain: &str, list: &[Expr]) -> Vec<u8> {
    [attr(1, &strz(table)), attr(2, &strz(chain)), nested(4, &expressions(list))].concat()
}

/// [`rule`] with a comment (libnftnl's user data: type, length, the
/// string with its NUL), unless it is too long.
pub(crate) fn commented_rule(table: &str, chain: &str, comment: &str, list: &[Expr]) -> Result<Vec<u8>, String> {
    let text = strz(comment);
    if 2 + text.len() > UDATA_COMMENT_MAXLEN {
        return Err(format!("comment longer than {} bytes", UDATA_COMMENT_MAXLEN - 3));
    }
    let user_data = attr(7, &[&[UDATA_RULE_COMMENT, text.len() as u8][..], &text].concat());
    Ok([attr(1, &strz(table)), attr(2, &strz(chain)), user_data, nested(4, &expressions(list))].concat())
}

/// One named set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetDesc<'a> {
    pub table: &'a str,
    pub name: &'a str,
    /// `NFT_SET_*`.
    pub flags: u32,
    /// nft's datatype number of the key (concatenations: 6 bits a part).
    pub key_type: u32,
    pub key_len: u32,
    /// The set ID, unique in the transaction.
    pub id: u32,
    /// The most elements (`size`).
    pub size: Option<u32>,
    /// The elements' default timeout, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// A counter per element.
    pub counter: bool,
}

/// `NFT_MSG_NEWSET`.
pub(crate) fn set(set: &SetDesc<'_>) -> Vec<u8> {
    let mut out =
        [attr(1, &strz(set.table)), attr(2, &strz(set.name)), be32(3, set.flags), be32(4, set.key_type), be32(5, set.key_len)].concat();
    if let Some(size) = set.size {
        // NFTA_SET_DESC { NFTA_SET_DESC_SIZE }.
        out.extend(nested(9, &be32(1, size)));
    }
    out.extend(be32(10, set.id));
    if let Some(timeout) = set.timeout_ms {
        out.extend(attr(11, &timeout.to_be_bytes()));
    }
    if set.counter {
        out.extend(Expr::Counter.encode(17));
    }
    out
}

/// `NFT_MSG_NEWSETELEM`/`_DELSETELEM`/`_GETSETELEM`: one element (`key`,
/// with its timeout in milliseconds) of set `set`, or with no key, just
/// table and set (a dump request).
pub(crate) fn set_element(table: &str, set: &str, key: Option<&[u8]>, timeout_ms: Option<u64>) -> Vec<u8> {
    let mut out = [attr(1, &strz(table)), attr(2, &strz(set))].concat();
    if let Some(key) = key {
        // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }, then NFTA_SET_ELEM_TIMEOUT.
        let mut element = data(1, key);
        if let Some(timeout) = timeout_ms {
            element.extend(attr(4, &timeout.to_be_bytes()));
        }
        out.extend(nested(3, &nested(1, &element)));
    }
    out
}

// ---- messages and batches ----

/// One netlink message of the nf_tables subsystem: header (sequence
/// number as given, port ID 0: the kernel's), nfgenmsg (family,
/// NFNETLINK_V0, `res_id` big endian: the subsystem for batch messages).
fn message(kind: u16, flags: u16, sequence: u32, family: u8, payload: &[u8]) -> Vec<u8> {
    let length = NLMSG_HEADER + NFGENMSG + payload.len();
    let mut out = Vec::with_capacity(length);
    out.extend((length as u32).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend(sequence.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    let res_id: u16 = if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END { NFNL_SUBSYS_NFTABLES } else { 0 };
    out.push(family);
    out.push(0);
    out.extend(res_id.to_be_bytes());
    out.extend(payload);
    out
}

/// One nf_tables transaction being built: messages between a batch begin
/// and end, numbered from 1 (the begin), each but begin and end asking
/// for an acknowledgement. The kernel applies all of them or none.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    bytes: Vec<u8>,
    acks: Vec<u32>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch { bytes: message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, NFPROTO_UNSPEC, &[]), acks: Vec::new() }
    }

    fn next_sequence(&self) -> u32 {
        2 + self.acks.len() as u32
    }

    /// Adds one message (`flags` besides `NLM_F_REQUEST | NLM_F_ACK`).
    pub(crate) fn add(&mut self, kind: u16, flags: u16, family: u8, payload: &[u8]) {
        let sequence = self.next_sequence();
        self.bytes.extend(message(kind, NLM_F_REQUEST | NLM_F_ACK | flags, sequence, family, payload));
        self.acks.push(sequence);
    }

    /// The whole transaction, one datagram (the kernel reads a batch from
    /// a single message), and the sequence numbers to be acknowledged.
    pub(crate) fn finish(self) -> Transaction {
        let end = message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, self.next_sequence(), NFPROTO_UNSPEC, &[]);
        Transaction { bytes: [self.bytes, end].concat(), acks: self.acks }
    }
}

/// A finished [`Batch`].
#[derive(Debug, Clone)]
pub(crate) struct Transaction {
    pub bytes: Vec<u8>,
    acks: Vec<u32>,
}

// ---- parsing (of the kernel's answers; lengths are never trusted) ----

/// One netlink message: its type, the nfgenmsg family and its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub kind: u16,
    pub family: u8,
    pub attributes: Vec<u8>,
}

/// One netlink header: length, type, flags, sequence number, port ID.
fn header(bytes: &[u8]) -> Option<(usize, u16, u16, u32, u32)> {
    let word = |at: usize| u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    (bytes.len() >= NLMSG_HEADER)
        .then(|| (word(0) as usize, u16::from_ne_bytes([bytes[4], bytes[5]]), u16::from_ne_bytes([bytes[6], bytes[7]]), word(8), word(12)))
}

/// The whole messages in `bytes` (several may follow each other), padding
/// skipped; a length running past the buffer ends the list.
fn split(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut found = Vec::new();
    while let Some((length, ..)) = header(bytes) {
        if length < NLMSG_HEADER || length > bytes.len() {
            break;
        }
        found.push(&bytes[..length]);
        bytes = bytes.get((length + 3) & !3..).unwrap_or_default();
    }
    found
}

/// The messages with an nfgenmsg in a buffer (several may follow each
/// other); anything malformed ends the parse.
pub(crate) fn parse_messages(bytes: &[u8]) -> Vec<Message> {
    split(bytes)
        .into_iter()
        .filter(|m| m.len() >= NLMSG_HEADER + NFGENMSG)
        .map(|m| Message {
            kind: u16::from_ne_bytes([m[4], m[5]]),
            family: m[NLMSG_HEADER],
            attributes: m[NLMSG_HEADER + NFGENMSG..].to_vec(),
        })
        .collect()
}

/// The attributes in `bytes` (type without the nested/byte-order flags),
/// or `None` unless the bytes are exactly a sequence of attributes.
pub(crate) fn attributes(mut bytes: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut found = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 4 {
            return None;
        }
        let length = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if length < 4 || length > bytes.len() {
            return None;
        }
        found.push((kind, &bytes[4..length]));
        let padded = ((length + 3) & !3).min(bytes.len());
        bytes = &bytes[padded..];
    }
    Some(found)
}

/// The value of the first attribute of type `kind` in `bytes`.
pub(crate) fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(bytes)?.into_iter().find(|(k, _)| *k == kind).map(|(_, v)| v)
}

/// A string attribute's text (up to its NUL).
pub(crate) fn string(value: &[u8]) -> String {
    String::from_utf8_lossy(value.split(|b| *b == 0).next().unwrap_or_default()).to_string()
}

/// A 32-bit attribute's value (network byte order).
pub(crate) fn be32_value(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.get(..4)?.try_into().ok()?))
}

/// A 64-bit attribute's value (network byte order).
pub(crate) fn be64_value(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.get(..8)?.try_into().ok()?))
}

// ---- the socket ----

/// Big enough for any datagram the kernel sends on this socket (libnftnl
/// uses 64 KiB plus a page).
const RECEIVE_BUFFER: usize = 128 * 1024;

/// A netfilter netlink socket (`NETLINK_NETFILTER`) bound to a port ID
/// the kernel picks, in the namespace of the thread that opens it. A thin
/// wrapper over `netlink-sys` (already here through rtnetlink): send one
/// datagram, receive datagrams; everything netlink is done here.
struct NfSocket {
    socket: Socket,
    portid: u32,
}

impl NfSocket {
    fn open() -> io::Result<NfSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        let portid = socket.bind_auto()?.port_number();
        Ok(NfSocket { socket, portid })
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let sent = self.socket.send(bytes, 0)?;
        if sent < bytes.len() {
            return Err(io::Error::other("netlink: the datagram was not sent whole"));
        }
        Ok(())
    }

    /// One datagram, its messages checked like libmnl's `mnl_cb_run`: from
    /// the kernel to this port, with `sequence` (0 on either side: no check),
    /// not an interrupted dump.
    fn receive<'b>(&self, buffer: &'b mut [u8], sequence: Option<u32>) -> io::Result<Vec<&'b [u8]>> {
        let length = loop {
            // MSG_TRUNC: the datagram's whole length even if it did not fit.
            match self.socket.recv(&mut &mut buffer[..], MsgFlags::MSG_TRUNC.bits()) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if length > buffer.len() {
            return Err(io::Error::other("netlink: datagram larger than the receive buffer"));
        }
        let messages = split(&buffer[..length]);
        for message in &messages {
            let Some((_, _, flags, seq, portid)) = header(message) else { continue };
            if portid != 0 && portid != self.portid {
                return Err(io::Error::from(Errno::ESRCH));
            }
            if let Some(expected) = sequence
                && seq != 0
                && expected != 0
                && seq != expected
            {
                return Err(io::Error::from(Errno::EPROTO));
            }
            if flags & NLM_F_DUMP_INTR != 0 {
                return Err(io::Error::from(io::ErrorKind::Interrupted));
            }
        }
        Ok(messages)
    }

    /// Sends a transaction and waits for the acknowledgement of each of
    /// its messages; an error (of any message, or of the commit) fails it.
    fn transact(&self, transaction: &Transaction) -> io::Result<()> {
        self.send(&transaction.bytes)?;
        let mut buffer = vec![0; RECEIVE_BUFFER];
        let mut pending = transaction.acks.as_slice();
        while let Some(&next) = pending.first() {
            for message in self.receive(&mut buffer, None)? {
                let Some((_, kind, _, sequence, _)) = header(message) else { continue };
                if kind != NLMSG_ERROR {
                    continue;
                }
                error_code(message)?;
                if sequence != next {
                    return Err(io::Error::from(Errno::EPROTO));
                }
                pending = &pending[1..];
                if pending.is_empty() {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sends a dump request and collects the answers until the kernel says
    /// it is done (or acknowledges).
    fn dump(&self, request: &[u8], sequence: u32) -> io::Result<Vec<Message>> {
        self.send(request)?;
        let mut buffer = vec![0; RECEIVE_BUFFER];
        let mut found = Vec::new();
        loop {
            let messages = self.receive(&mut buffer, Some(sequence))?;
            if messages.is_empty() {
                return Ok(found);
            }
            for message in messages {
                let Some((_, kind, ..)) = header(message) else { continue };
                match kind {
                    NLMSG_DONE => return Ok(found),
                    NLMSG_ERROR => {
                        error_code(message)?;
                        return Ok(found);
                    }
                    NLMSG_NOOP | NLMSG_OVERRUN => {}
                    _ => found.extend(parse_messages(message)),
                }
            }
        }
    }
}

/// An `NLMSG_ERROR` message: `Ok` for an acknowledgement (error 0).
fn error_code(message: &[u8]) -> io::Result<()> {
    let code = message.get(NLMSG_HEADER..NLMSG_HEADER + 4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match code {
        Some(0) => Ok(()),
        Some(code) => Err(io::Error::from_raw_os_error(-code)),
        None => Err(io::Error::other("netlink: truncated error message")),
    }
}

/// Runs a transaction in the calling thread's namespace.
pub(crate) fn transact(transaction: &Transaction) -> io::Result<()> {
    NfSocket::open()?.transact(transaction)
}

/// Runs a transaction like [`transact`], but closes the socket afterwards
/// on a helper thread. Once acknowledged the transaction is committed, but
/// closing an nftables socket after a deletion waits for the kernel to
/// free the deleted objects (an RCU grace period, 5-35 ms here) that
/// nothing needs to wait for. The socket is opened on the calling thread
/// (hence in its namespace); the helper reports the result, then closes it.
pub(crate) fn transact_detached(transaction: Transaction) -> io::Result<()> {
    let socket = NfSocket::open()?;
    let (report, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = report.send(socket.transact(&transaction));
        drop(socket);
    });
    result.recv().map_err(|_| io::Error::other("nftables worker thread panicked"))?
}

/// The request [`dump`] sends.
fn dump_request(kind: u16, family: u8, flags: u16, payload: &[u8]) -> Vec<u8> {
    message(kind, NLM_F_REQUEST | NLM_F_DUMP | flags, 1, family, payload)
}

/// Dumps every object of one kind (`NFT_MSG_GET*`) of `family` (0: all)
/// that `payload` selects (e.g. the table's name), in the calling thread's
/// namespace. Only the nf_tables messages are returned.
pub(crate) fn dump(kind: u16, family: u8, payload: &[u8]) -> io::Result<Vec<Message>> {
    NfSocket::open()?.dump(&dump_request(kind, family, 0, payload), 1)
}

/// One nftables table: its `NFPROTO_*` family and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableRef {
    pub family: u8,
    pub name: String,
}

/// The tables in dumped messages (`NFT_MSG_NEWTABLE`, name attribute);
/// anything else is skipped.
pub(crate) fn tables(messages: &[Message]) -> Vec<TableRef> {
    messages
        .iter()
        .filter(|m| m.kind == NFT_MSG_NEWTABLE)
        .filter_map(|m| {
            Some(TableRef {
                family: m.family,
                name: std::str::from_utf8(find(&m.attributes, 1)?.split(|b| *b == 0).next()?).ok()?.to_string(),
            })
        })
        .collect()
}

/// Every nftables table (all families) in the calling thread's namespace.
pub(crate) fn list_tables() -> io::Result<Vec<TableRef>> {
    // With NLM_F_ACK, as libnftnl's request had (no effect on a dump).
    let request = dump_request(NFT_MSG_GETTABLE, NFPROTO_UNSPEC, NLM_F_ACK, &[]);
    Ok(tables(&NfSocket::open()?.dump(&request, 1)?))
}

#[cfg(test)]
pub(crate) mod fixtures;

/// Test support shared with the modules that build messages.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub(crate) fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex fixture")).collect()
    }

    /// `bytes` (whole messages) with what legitimately differs between two
    /// encodings of the same transaction made equal: the sequence number
    /// and port ID of every message (zeroed: assigned when sent), and
    /// `NLM_F_ACK` on the batch begin and end messages (cleared: libnftnl
    /// sets it only on kernels from 6.10, this codec never: the
    /// acknowledgements of the messages inside the batch come after the
    /// commit anyway).
    pub(crate) fn normalized(bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        let mut at = 0;
        while let Some((length, kind, flags, ..)) = header(&out[at..]) {
            if length < NLMSG_HEADER {
                break;
            }
            out[at + 8..at + 16].fill(0);
            if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END {
                out[at + 6..at + 8].copy_from_slice(&(flags & !NLM_F_ACK).to_ne_bytes());
            }
            at += (length + 3) & !3;
        }
        out
    }

    /// Fails with the first differing message of the two, decoded.
    pub(crate) fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
        let (actual, expected) = (normalized(actual), normalized(expected));
        if actual == expected {
            return;
        }
        let (a, e) = (split(&actual), split(&expected));
        for (index, (a, e)) in a.iter().zip(&e).enumerate() {
            assert_eq!(a, e, "{what}: message {index} differs (of {} and {})", split(&actual).len(), split(&expected).len());
        }
        panic!("{what}: {} messages, expected {}", a.len(), e.len());
    }

    /// The old raw encoder put `meta` and `ct`'s destination register
    /// before the key; this codec (like libnftnl) puts the key first. The
    /// kernel parses attributes by type; the fixture is reordered so that
    /// everything else is compared byte for byte.
    pub(crate) fn key_first(mut bytes: Vec<u8>) -> Vec<u8> {
        // Expression name attribute, then the 20-byte data attribute
        // (nested flag) of two 8-byte attributes: DREG (1), KEY (2).
        let heads: [&[u8]; 2] =
            [&[9, 0, 1, 0, b'm', b'e', b't', b'a', 0, 0, 0, 0, 20, 0, 2, 0x80], &[7, 0, 1, 0, b'c', b't', 0, 0, 20, 0, 2, 0x80]];
        let mut at = 0;
        while at < bytes.len() {
            if let Some(head) = heads.iter().find(|h| bytes[at..].starts_with(h)) {
                let data = at + head.len();
                assert_eq!(&bytes[data..data + 4], &[8, 0, 1, 0], "DREG first in the fixture");
                bytes[data..data + 16].rotate_left(8);
                at = data + 16;
            } else {
                at += 1;
            }
        }
        bytes
    }

    /// The counting chains, as the fixture's old raw-encoder bytes (meta
    /// and ct attributes put key first): exported for `refused`'s test.
    pub(crate) fn counting_chains_fixture() -> Vec<u8> {
        key_first(hex(super::fixtures::COUNTING_CHAINS))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{assert_same, hex, key_first};
    use super::*;

    #[test]
    fn dump_requests_match() {
        assert_same(&dump_request(NFT_MSG_GETTABLE, NFPROTO_UNSPEC, NLM_F_ACK, &[]), &hex(fixtures::GET_TABLES), "list tables");
        let request = dump_request(NFT_MSG_GETSET, NFPROTO_INET, 0, &table("lazaret-locked", None));
        assert_same(&request, &hex(fixtures::GETSET_DUMP), "set dump");
    }

    #[test]
    fn sets_and_elements_match_the_raw_encoder() {
        // As `nftset::create_table_and_sets` sends them (its numbers here,
        // the modules themselves are checked in their own tests).
        let mut batch = Batch::new();
        batch.add(NFT_MSG_NEWTABLE, NLM_F_CREATE, NFPROTO_INET, &table("lazaret-locked", None));
        for (id, (name, v4)) in [("names4", true), ("names6_p22", false)].into_iter().enumerate() {
            let (key_type, key_len) = if v4 { (7, 4) } else { (8, 16) };
            let desc = SetDesc {
                table: "lazaret-locked",
                name,
                flags: NFT_SET_TIMEOUT,
                key_type,
                key_len,
                id: id as u32 + 1,
                size: None,
                timeout_ms: None,
                counter: false,
            };
            batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &set(&desc));
        }
        for (id, (name, v4)) in [("refused4", true), ("refused6", false)].into_iter().enumerate() {
            let desc = SetDesc {
                table: "lazaret-locked",
                name,
                flags: NFT_SET_TIMEOUT | NFT_SET_EVAL,
                key_type: if v4 { 7 << 12 | 12 << 6 | 13 } else { 8 << 12 | 12 << 6 | 13 },
                key_len: if v4 { 12 } else { 24 },
                id: id as u32 + 3,
                size: Some(1024),
                timeout_ms: Some(3_600_000),
                counter: true,
            };
            batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &set(&desc));
        }
        assert_same(&batch.finish().bytes, &hex(fixtures::TABLE_AND_SETS), "table and sets");

        let mut batch = Batch::new();
        for (name, key) in [("names4", &[192, 0, 2, 1][..]), ("names6_p22", &[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7][..])]
        {
            let timed = set_element("lazaret-locked", name, Some(key), Some(90_500));
            batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
            batch.add(NFT_MSG_DELSETELEM, 0, NFPROTO_INET, &set_element("lazaret-locked", name, Some(key), None));
            batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
        }
        assert_same(&batch.finish().bytes, &hex(fixtures::PUT_ELEMENTS), "set elements");
    }

    #[test]
    fn the_key_first_reordering_only_moves_meta_and_ct_attributes() {
        let old = hex(fixtures::COUNTING_CHAINS);
        let new = key_first(old.clone());
        assert_eq!(old.len(), new.len());
        let differing = old.iter().zip(&new).filter(|(a, b)| a != b).count();
        assert!(differing > 0 && differing < old.len() / 10, "{differing}");
    }

    #[test]
    fn expressions_parse_back() {
        let list = [
            Expr::Meta { key: NFT_META_L4PROTO, dreg: NFT_REG_1 },
            Expr::Cmp { op: NFT_CMP_EQ, value: vec![6] },
            Expr::Verdict(Verdict::Goto("refuse".into())),
            Expr::Masquerade,
        ];
        let encoded = expressions(&list);
        let elements = attributes(&encoded).expect("list");
        assert_eq!(elements.len(), 4);
        let names: Vec<String> = elements.iter().map(|(_, e)| string(find(e, 1).expect("name"))).collect();
        assert_eq!(names, ["meta", "cmp", "immediate", "masq"]);
        let verdict = find(find(find(elements[2].1, 2).expect("data"), 2).expect("immediate data"), 2).expect("verdict");
        assert_eq!(find(verdict, 1).and_then(be32_value), Some(NFT_GOTO));
        assert_eq!(find(verdict, 2).map(string).as_deref(), Some("refuse"));
        // libnftnl's limit: 125 bytes and the NUL, after type and length.
        assert!(commented_rule("t", "c", &"x".repeat(126), &list).is_err());
        let commented = commented_rule("t", "c", &"x".repeat(125), &list).expect("fits");
        assert_eq!(find(&commented, 7).map(|u| (u[0], u[1], u.len())), Some((0, 126, 128)));
        assert_eq!(find(&commented, 4), find(&rule("t", "c", &list), 4));
    }

    #[test]
    fn answers_are_parsed_without_trusting_lengths() {
        let mut buffer = message(NFT_MSG_NEWTABLE, 0, 1, NFPROTO_INET, &[attr(2, &[0; 4]), attr(1, b"lazaret-x\0")].concat());
        buffer.extend(message(NFT_MSG_NEWTABLE, 0, 1, NFPROTO_IPV4, &attr(1, b"filter\0")));
        buffer.extend(message(NLMSG_DONE, 0, 1, 0, &[]));
        let found = tables(&parse_messages(&buffer));
        assert_eq!(
            found,
            [TableRef { family: NFPROTO_INET, name: "lazaret-x".into() }, TableRef { family: NFPROTO_IPV4, name: "filter".into() }]
        );
        let mut truncated = message(NFT_MSG_NEWTABLE, 0, 1, NFPROTO_INET, &attr(1, b"x\0"));
        truncated[0] = 200;
        assert!(parse_messages(&truncated).is_empty());
        assert_eq!(attributes(&[8, 0, 1, 0, 1]), None);
        assert_eq!(
            error_code(&[[36u8, 0, 0, 0, 2, 0].as_slice(), &[0; 10], &(-17i32).to_ne_bytes()].concat()).map_err(|e| e.raw_os_error()),
            Err(Some(17))
        );
    }
}
