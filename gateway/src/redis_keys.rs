//! The key store in Redis, shared by every gateway and by `keys ... --redis-url` on any machine.
//!
//! Records are the same as in the file store (hashes only, never keys), one JSON value per key
//! id in the hash `as:{keys}`, and every change increments `as:{keys}:version`; a gateway reads
//! the version every `key_refresh_ms` and reloads the records only when it moved. Both keys
//! carry the hash tag `{keys}`, so they share a cluster slot and one script can change both.
//! Changes are read-modify-write with a compare-and-set on the version, retried on a conflict,
//! so concurrent `keys` commands never lose each other's writes. Records are never deleted; a
//! running gateway writes back any that Redis lost ([`RedisKeyStore::restore`]).

use std::sync::Arc;

use crate::keys::{KeyError, KeyRecord};
use crate::redis_conn::{CONNECT_TIMEOUT, RedisConn, RedisError, RedisHub, within};

const RECORDS: &str = "as:{keys}";
const VERSION: &str = "as:{keys}:version";
/// Last use per key id (Unix seconds): apart from the records, so uses do not move the version.
const LAST_USED: &str = "as:{keys}:used";
/// Sets each field `ARGV[i]` to `ARGV[i + 1]` unless it already holds a later time.
const KEEP_LATEST: &str = r"
for i = 1, #ARGV, 2 do
  local old = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > old then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
";
/// Writes `ARGV[2..]` (id, record pairs) if the version is still `ARGV[1]`; answers the new
/// version, or -1 when another writer came first.
const COMPARE_AND_SET: &str = r"
local v = redis.call('GET', KEYS[2]) or '0'
if v ~= ARGV[1] then return -1 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return redis.call('INCR', KEYS[2])
";
/// Writes back records Redis lost: each `ARGV` triple (id, record, revoked: 1 or 0) is set if the
/// id is absent, or over a record that is not revoked when this one is (a revocation is never
/// undone); then the version moves, so every gateway reloads. Answers how many were written.
const RESTORE: &str = r"
local written = 0
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    written = written + 1
  elseif ARGV[i + 2] == '1' then
    local current = cjson.decode(redis.call('HGET', KEYS[1], ARGV[i]))
    if current['revoked'] == nil or current['revoked'] == cjson.null then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
      written = written + 1
    end
  end
end
if written > 0 then redis.call('INCR', KEYS[2]) end
return written
";
/// Attempts of one change against concurrent writers.
const ATTEMPTS: usize = 20;

/// The key records in Redis.
#[derive(Clone)]
pub struct RedisKeyStore {
    hub: Arc<RedisHub>,
}

impl RedisKeyStore {
    /// The store on `hub`.
    pub fn new(hub: Arc<RedisHub>) -> RedisKeyStore {
        RedisKeyStore { hub }
    }

    /// The hub, for callers that must run a change without a runtime of their own.
    pub fn hub(&self) -> &Arc<RedisHub> {
        &self.hub
    }

    async fn conn(&self) -> Result<RedisConn, KeyError> {
        within(CONNECT_TIMEOUT, self.hub.connect())
            .await
            .map_err(|e| self.error(e))
    }

    /// The version: it moves on every change.
    pub async fn version(&self) -> Result<u64, KeyError> {
        let mut conn = self.conn().await?;
        let version: Option<u64> = within(CONNECT_TIMEOUT, async {
            Ok(redis::cmd("GET")
                .arg(VERSION)
                .query_async(&mut conn)
                .await?)
        })
        .await
        .map_err(|e| self.error(e))?;
        Ok(version.unwrap_or(0))
    }

    /// The version and every record, read together, oldest first.
    pub async fn load(&self) -> Result<(u64, Vec<KeyRecord>), KeyError> {
        let mut conn = self.conn().await?;
        let (version, records): (Option<u64>, Vec<(String, String)>) =
            within(CONNECT_TIMEOUT, async {
                Ok(redis::pipe()
                    .atomic()
                    .get(VERSION)
                    .hgetall(RECORDS)
                    .query_async(&mut conn)
                    .await?)
            })
            .await
            .map_err(|e| self.error(e))?;
        let mut parsed = Vec::with_capacity(records.len());
        for (id, json) in records {
            let record: KeyRecord = serde_json::from_str(&json).map_err(|e| KeyError::Corrupt {
                path: format!("redis {RECORDS} field {id}").into(),
                message: e.to_string(),
            })?;
            parsed.push(record);
        }
        parsed.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok((version.unwrap_or(0), parsed))
    }

    /// Applies `change` to the records and writes back those it changed or added, atomically
    /// against other writers.
    pub async fn update(
        &self,
        mut change: impl FnMut(&mut Vec<KeyRecord>) -> Result<(), KeyError>,
    ) -> Result<(), KeyError> {
        let script = redis::Script::new(COMPARE_AND_SET);
        for _ in 0..ATTEMPTS {
            let (version, before) = self.load().await?;
            let mut after = before.clone();
            change(&mut after)?;
            let mut invocation = script.key(RECORDS);
            invocation.key(VERSION).arg(version);
            for record in after.iter().filter(|r| !before.contains(r)) {
                let json = serde_json::to_string(record).expect("records serialize");
                invocation.arg(&record.id).arg(json);
            }
            let mut conn = self.conn().await?;
            let written: i64 = within(CONNECT_TIMEOUT, async {
                Ok(invocation.invoke_async(&mut conn).await?)
            })
            .await
            .map_err(|e| self.error(e))?;
            if written >= 0 {
                return Ok(());
            }
        }
        Err(KeyError::Redis(
            "too many concurrent changes; try again".to_owned(),
        ))
    }

    /// Writes back `records` that Redis no longer has (see `RESTORE`); returns how many it
    /// wrote.
    pub async fn restore(&self, records: &[KeyRecord]) -> Result<u64, KeyError> {
        let script = redis::Script::new(RESTORE);
        let mut invocation = script.key(RECORDS);
        invocation.key(VERSION);
        for record in records {
            let json = serde_json::to_string(record).expect("records serialize");
            invocation
                .arg(&record.id)
                .arg(json)
                .arg(u8::from(record.revoked.is_some()));
        }
        let mut conn = self.conn().await?;
        within(CONNECT_TIMEOUT, async {
            Ok(invocation.invoke_async(&mut conn).await?)
        })
        .await
        .map_err(|e| self.error(e))
    }

    /// When each key was last used (Unix seconds, to the minute).
    pub async fn last_used(&self) -> Result<std::collections::HashMap<String, u64>, KeyError> {
        let mut conn = self.conn().await?;
        within(CONNECT_TIMEOUT, async {
            Ok(redis::cmd("HGETALL")
                .arg(LAST_USED)
                .query_async(&mut conn)
                .await?)
        })
        .await
        .map_err(|e| self.error(e))
    }

    /// Records uses (key id, Unix seconds), keeping the later of old and new.
    pub async fn record_use(&self, uses: &[(String, u64)]) -> Result<(), KeyError> {
        if uses.is_empty() {
            return Ok(());
        }
        let script = redis::Script::new(KEEP_LATEST);
        let mut invocation = script.key(LAST_USED);
        for (id, at) in uses {
            invocation.arg(id).arg(*at);
        }
        let mut conn = self.conn().await?;
        within(CONNECT_TIMEOUT, async {
            let _: i64 = invocation.invoke_async(&mut conn).await?;
            Ok(())
        })
        .await
        .map_err(|e| self.error(e))
    }

    fn error(&self, e: RedisError) -> KeyError {
        KeyError::Redis(format!("{} ({})", e, self.hub.describe()))
    }
}
