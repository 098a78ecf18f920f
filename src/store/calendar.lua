-- Spliced into stack.lua's calendar branch and prepended to settle.lua
-- (src/store/script.rs): the calendar arithmetic both scripts need, in
-- one place.

-- Calendar months in UTC (window = "1mo", p4 = 2): the month `us` falls in,
-- counted from January 1970, and the instant (us) the next one starts; as
-- src/limit/calendar.rs (Hinnant's civil_from_days / days_from_civil).
local function month_of(us)
  local fl = math.floor
  local z = fl(us / 86400000000) + 719468
  local era = fl(z / 146097)
  local doe = z - era * 146097
  local yoe = fl((doe - fl(doe / 1460) + fl(doe / 36524) - fl(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + fl(yoe / 4) - fl(yoe / 100))
  local mp = fl((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  local y = yoe + era * 400 + ((m <= 2) and 1 or 0)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  local yy = (nm <= 2) and (ny - 1) or ny
  local e2 = fl(yy / 400)
  local yoe2 = yy - e2 * 400
  local mp2 = (nm > 2) and (nm - 3) or (nm + 9)
  local doe2 = yoe2 * 365 + fl(yoe2 / 4) - fl(yoe2 / 100) + fl((153 * mp2 + 2) / 5)
  return (y - 1970) * 12 + (m - 1), (e2 * 146097 + doe2 - 719468) * 86400000000
end
