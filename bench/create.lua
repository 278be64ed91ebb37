-- wrk script: POST /v1/pets with a JSON body (optionally with a bearer key from KEY).
wrk.method = "POST"
wrk.body = '{"name":"bench","categoryId":1,"status":"available"}'
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("KEY")
if key and key ~= "" then wrk.headers["Authorization"] = "Bearer " .. key end
