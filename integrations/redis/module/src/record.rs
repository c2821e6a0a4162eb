//! A write's recorded reply: MessagePack, as the Lua scripts record theirs
//! (`cmsgpack.pack`): integers, nil (as `false`, which is what the scripts
//! return for it: a Lua table cannot hold nil), byte strings (as `str`)
//! and arrays.
//! A resent write finds the record and answers with it instead of running
//! again (see `dynemb-redis`'s `scripts` module).

use crate::rows::Reply;
use rmp::Marker;

/// The record of `reply`.
pub fn encode(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    write(reply, &mut out);
    out
}

fn write(reply: &Reply, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    match reply {
        Reply::Int(i) => {
            rmp::encode::write_sint(out, *i).expect("to a Vec");
        }
        Reply::Nil => rmp::encode::write_bool(out, false).expect("to a Vec"),
        Reply::Bytes(bytes) => {
            let len = u32::try_from(bytes.len()).expect("a row is far below 4 GiB");
            rmp::encode::write_str_len(out, len).expect("to a Vec");
            out.extend_from_slice(bytes);
        }
        Reply::Array(items) => {
            let len = u32::try_from(items.len()).expect("a call is far below 2^32 rows");
            rmp::encode::write_array_len(out, len).expect("to a Vec");
            for item in items {
                write(item, out);
            }
        }
    }
}

/// The reply recorded in `bytes` (written by [`encode`] or by a Lua
/// script's `cmsgpack.pack`: `false` reads as nil), or why it is not one.
pub fn decode(bytes: &[u8]) -> Result<Reply, String> {
    let mut rest = bytes;
    let reply = read(&mut rest, 0)?;
    if rest.is_empty() {
        Ok(reply)
    } else {
        Err(format!("{} bytes after a recorded reply", rest.len()))
    }
}

/// Deepest array nesting a record may have (replies nest at most twice).
const MAX_DEPTH: usize = 4;

fn read(rest: &mut &[u8], depth: usize) -> Result<Reply, String> {
    let marker = rmp::decode::read_marker(rest).map_err(|_| "a record ends early".to_string())?;
    let uint = |rest: &mut &[u8], n: usize| -> Result<u64, String> {
        let bytes = take(rest, n)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    let int = |v: u64| {
        i64::try_from(v)
            .map(Reply::Int)
            .map_err(|_| "an integer past i64".to_string())
    };
    Ok(match marker {
        Marker::FixPos(v) => Reply::Int(i64::from(v)),
        Marker::FixNeg(v) => Reply::Int(i64::from(v)),
        Marker::U8 => int(uint(rest, 1)?)?,
        Marker::U16 => int(uint(rest, 2)?)?,
        Marker::U32 => int(uint(rest, 4)?)?,
        Marker::U64 => int(uint(rest, 8)?)?,
        Marker::I8 => Reply::Int(i64::from(uint(rest, 1)? as u8 as i8)),
        Marker::I16 => Reply::Int(i64::from(uint(rest, 2)? as u16 as i16)),
        Marker::I32 => Reply::Int(i64::from(uint(rest, 4)? as u32 as i32)),
        Marker::I64 => Reply::Int(uint(rest, 8)? as i64),
        Marker::Null | Marker::False => Reply::Nil,
        Marker::FixStr(n) => Reply::Bytes(take(rest, usize::from(n))?.to_vec()),
        Marker::Str8 | Marker::Bin8 => {
            let n = uint(rest, 1)? as usize;
            Reply::Bytes(take(rest, n)?.to_vec())
        }
        Marker::Str16 | Marker::Bin16 => {
            let n = uint(rest, 2)? as usize;
            Reply::Bytes(take(rest, n)?.to_vec())
        }
        Marker::Str32 | Marker::Bin32 => {
            let n = uint(rest, 4)? as usize;
            Reply::Bytes(take(rest, n)?.to_vec())
        }
        Marker::FixArray(n) => array(rest, usize::from(n), depth)?,
        Marker::Array16 => {
            let n = uint(rest, 2)? as usize;
            array(rest, n, depth)?
        }
        Marker::Array32 => {
            let n = uint(rest, 4)? as usize;
            array(rest, n, depth)?
        }
        other => return Err(format!("a record holds {other:?}, which no reply has")),
    })
}

fn array(rest: &mut &[u8], n: usize, depth: usize) -> Result<Reply, String> {
    if depth >= MAX_DEPTH {
        return Err("a record nests too deep".into());
    }
    // Each item takes at least a byte: a count past the bytes left is bad.
    if n > rest.len() {
        return Err(format!("a record's array of {n} items overruns it"));
    }
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        items.push(read(rest, depth + 1)?);
    }
    Ok(Reply::Array(items))
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err("a record ends early".into());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replies_round_trip() {
        let replies = [
            Reply::Int(0),
            Reply::Int(-1),
            Reply::Int(300),
            Reply::Int(-70_000),
            Reply::Int(i64::MAX),
            Reply::Nil,
            Reply::Bytes(vec![0, 1, 2, 255]),
            Reply::Bytes(vec![7; 70_000]),
            Reply::Array(vec![]),
            Reply::Array(vec![Reply::Nil, Reply::Bytes(vec![0; 40]), Reply::Int(5)]),
            Reply::Array((0..100_000).map(Reply::Int).collect()),
        ];
        for reply in replies {
            assert_eq!(decode(&encode(&reply)).unwrap(), reply);
        }
    }

    #[test]
    fn lua_records_read_as_the_same_replies() {
        // cmsgpack.pack({false, "ab", 3, -1}): false reads as nil.
        let lua = [0x94, 0xc2, 0xa2, b'a', b'b', 0x03, 0xff];
        assert_eq!(
            decode(&lua).unwrap(),
            Reply::Array(vec![
                Reply::Nil,
                Reply::Bytes(b"ab".to_vec()),
                Reply::Int(3),
                Reply::Int(-1)
            ])
        );
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(Reply::Int),
            Just(Reply::Nil),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(Reply::Bytes),
        ];
        leaf.prop_recursive(2, 64, 20, |inner| {
            proptest::collection::vec(inner, 0..20).prop_map(Reply::Array)
        })
    }

    proptest! {
        #[test]
        fn any_reply_round_trips(reply in reply()) {
            prop_assert_eq!(decode(&encode(&reply)).unwrap(), reply);
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let _ = decode(&bytes);
        }

        #[test]
        fn a_cut_record_is_an_error(reply in reply(), cut in any::<proptest::sample::Index>()) {
            let bytes = encode(&reply);
            let cut = cut.index(bytes.len());
            prop_assert!(decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn bad_records_are_errors() {
        for bad in [
            &[][..],
            &[0x92, 0x01],                         // an array short of items
            &[0xa5, b'a'],                         // a string short of bytes
            &[0xdd, 0xff, 0xff, 0xff, 0xff],       // a huge array count
            &[0xcb, 0, 0, 0, 0, 0, 0, 0, 0],       // a float
            &[0x01, 0x02],                         // bytes after the reply
            &[0x91, 0x91, 0x91, 0x91, 0x91, 0x01], // too deep
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
