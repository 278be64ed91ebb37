-- wrk script: GET with a bearer key from KEY (if set).
local key = os.getenv("KEY")
if key and key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
