// kinesalite (Kinesis's API on LevelDB) with two faults a test switches on through a JSON control
// file (KINESALITE_CONTROL), read at most every 50 ms:
//   {"throttle_until_ms": T}  GetRecords answers ProvisionedThroughputExceededException until T
//   {"clock_offset_ms": D}    kinesalite's clock runs D ms ahead: iterators made before expire
//   {"behind_ms": B}          GetRecords of an open shard says MillisBehindLatest B (kinesalite
//                             itself always says 0 there)
// Usage: node kinesalite.js <kinesalite package folder> --port N
'use strict'
const fs = require('fs')
const path = require('path')

const pkg = process.argv[2]
const control = process.env.KINESALITE_CONTROL
const realNow = Date.now
let cached = {}
let readAt = 0
function ctl() {
  const now = realNow()
  if (control && now - readAt > 50) {
    readAt = now
    try { cached = JSON.parse(fs.readFileSync(control, 'utf8')) } catch (e) { cached = {} }
  }
  return cached
}
Date.now = () => realNow() + (ctl().clock_offset_ms || 0)

const db = require(path.join(pkg, 'db'))
const getRecordsPath = require.resolve(path.join(pkg, 'actions', 'getRecords'))
const getRecords = require(getRecordsPath)
require.cache[getRecordsPath].exports = function throttled(store, data, cb) {
  if (realNow() < (ctl().throttle_until_ms || 0)) {
    return cb(db.clientError('ProvisionedThroughputExceededException',
      'Rate exceeded for shard in stream under account 000000000000.'))
  }
  return getRecords(store, data, function(err, res) {
    const behind = ctl().behind_ms
    if (!err && behind != null && res.NextShardIterator) res.MillisBehindLatest = behind
    cb(err, res)
  })
}
process.argv = [process.argv[0], path.join(pkg, 'cli.js'), ...process.argv.slice(3)]
require(path.join(pkg, 'cli.js'))
