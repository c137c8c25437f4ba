{{/*
CEL fragments of the claim-parameters policy. Each rule is one predicate over `c`, a config
entry of this driver whose opaque parameters are an object (variables.configs); the policy
uses it both to validate (all entries pass) and to word the message (the first that fails).
The rules mirror dra_driver/config/params.py.
*/}}

{{- define "gfd.cel.where" -}}
(c.?requests.orValue([]).size() == 0 ? "all requests" : "request(s) " + c.requests.join(", "))
{{- end -}}

{{- define "gfd.cel.prefix" -}}
"{{ .Values.driverName }} parameters for " + {{ include "gfd.cel.where" . }} + ": "
{{- end -}}

{{- define "gfd.cel.apiKind" -}}
c.opaque.parameters.?apiVersion.orValue("") == "gpu-fraction.dra.dev/v1alpha1" && c.opaque.parameters.?kind.orValue("") == "GpuFractionParameters"
{{- end -}}

{{- define "gfd.cel.known" -}}
c.opaque.parameters.all(k, k in variables.knownFields)
{{- end -}}

{{- define "gfd.cel.exclusive" -}}
!(has(c.opaque.parameters.memoryLimit) && has(c.opaque.parameters.memoryLimitPortion))
{{- end -}}

{{- define "gfd.cel.quantity" -}}
!has(c.opaque.parameters.memoryLimit) || (type(c.opaque.parameters.memoryLimit) == int && c.opaque.parameters.memoryLimit > 0) || (type(c.opaque.parameters.memoryLimit) == string && isQuantity(c.opaque.parameters.memoryLimit) && quantity(c.opaque.parameters.memoryLimit).isGreaterThan(quantity("0")) && quantity(c.opaque.parameters.memoryLimit).isInteger())
{{- end -}}

{{- define "gfd.cel.portion" -}}
!has(c.opaque.parameters.memoryLimitPortion) || (type(c.opaque.parameters.memoryLimitPortion) == string && c.opaque.parameters.memoryLimitPortion.matches(r'^(0*1(\.0*)?|0*\.[0-9]*[1-9][0-9]*)$')) || (type(c.opaque.parameters.memoryLimitPortion) == double && c.opaque.parameters.memoryLimitPortion > 0.0 && c.opaque.parameters.memoryLimitPortion <= 1.0) || (type(c.opaque.parameters.memoryLimitPortion) == int && c.opaque.parameters.memoryLimitPortion == 1)
{{- end -}}

{{- define "gfd.cel.mode" -}}
!has(c.opaque.parameters.computeMode) || c.opaque.parameters.computeMode in ["time-slicing", "sm-sharing"]
{{- end -}}

{{- define "gfd.cel.percentage" -}}
!has(c.opaque.parameters.activeThreadPercentage) || (type(c.opaque.parameters.activeThreadPercentage) == int && c.opaque.parameters.activeThreadPercentage >= 1 && c.opaque.parameters.activeThreadPercentage <= 100)
{{- end -}}

{{- define "gfd.cel.consumers" -}}
!has(c.opaque.parameters.maxConsumers) || (type(c.opaque.parameters.maxConsumers) == int && c.opaque.parameters.maxConsumers >= 1 && c.opaque.parameters.maxConsumers <= 32)
{{- end -}}

{{- define "gfd.cel.percentageMode" -}}
!has(c.opaque.parameters.activeThreadPercentage) || c.opaque.parameters.?computeMode.orValue("") != "time-slicing"
{{- end -}}

{{/* A limit given as a valid quantity (the only kind compared with requests). */}}
{{- define "gfd.cel.hasLimit" -}}
has(c.opaque.parameters.memoryLimit) && ((type(c.opaque.parameters.memoryLimit) == string && isQuantity(c.opaque.parameters.memoryLimit)) || type(c.opaque.parameters.memoryLimit) == int)
{{- end -}}

{{/* x = [request name, requested memory, parent request name]: does c apply to it, and is
     c's limit below the memory it requests? */}}
{{- define "gfd.cel.below" -}}
(c.?requests.orValue([]).size() == 0 || x[0] in c.requests || x[2] in c.requests) && quantity(string(c.opaque.parameters.memoryLimit)).compareTo(quantity(x[1])) < 0
{{- end -}}

{{- define "gfd.cel.limitVsRequest" -}}
!({{ include "gfd.cel.hasLimit" . }}) || (!variables.memoryRequests.exists(x, {{ include "gfd.cel.below" . }}) && !variables.subrequestMemory.exists(l, l.exists(x, {{ include "gfd.cel.below" . }})))
{{- end -}}

{{/* The caps (maxMemoryLimit, maxMemoryLimitPortion, maxActiveThreadPercentage) as written in
     a config entry: the shapes dra_driver/config/params.py accepts. */}}
{{- define "gfd.cel.capShapes" -}}
(!has(c.opaque.parameters.maxMemoryLimit) || (type(c.opaque.parameters.maxMemoryLimit) == int && c.opaque.parameters.maxMemoryLimit > 0) || (type(c.opaque.parameters.maxMemoryLimit) == string && isQuantity(c.opaque.parameters.maxMemoryLimit) && quantity(c.opaque.parameters.maxMemoryLimit).isGreaterThan(quantity("0")) && quantity(c.opaque.parameters.maxMemoryLimit).isInteger())) && (!has(c.opaque.parameters.maxMemoryLimitPortion) || (type(c.opaque.parameters.maxMemoryLimitPortion) == string && c.opaque.parameters.maxMemoryLimitPortion.matches(r'^(0*1(\.0*)?|0*\.[0-9]*[1-9][0-9]*)$')) || (type(c.opaque.parameters.maxMemoryLimitPortion) == double && c.opaque.parameters.maxMemoryLimitPortion > 0.0 && c.opaque.parameters.maxMemoryLimitPortion <= 1.0) || (type(c.opaque.parameters.maxMemoryLimitPortion) == int && c.opaque.parameters.maxMemoryLimitPortion == 1)) && (!has(c.opaque.parameters.maxActiveThreadPercentage) || (type(c.opaque.parameters.maxActiveThreadPercentage) == int && c.opaque.parameters.maxActiveThreadPercentage >= 1 && c.opaque.parameters.maxActiveThreadPercentage <= 100))
{{- end -}}

{{/* x = [request name, class, parent, requested memory]: does config entry c apply to it? */}}
{{- define "gfd.cel.applies" -}}
(c.?requests.orValue([]).size() == 0 || x[0] in c.requests || x[2] in c.requests)
{{- end -}}

{{/* The caps c breaks on request x, as a list of messages (empty: none). Only values that
     passed their shape rule are compared. */}}
{{- define "gfd.cel.capProblems" -}}
(has(c.opaque.parameters.memoryLimitPortion) && ({{ include "gfd.cel.portion" . }}) && x[1] in variables.portionCaps && double(c.opaque.parameters.memoryLimitPortion) > variables.portionCaps[x[1]] + 0.000001 ? ["memoryLimitPortion " + string(c.opaque.parameters.memoryLimitPortion) + " on request " + x[0] + " exceeds what DeviceClass " + x[1] + " allows (" + string(variables.portionCaps[x[1]]) + " of the card; without a cap set by an admin a ceiling is the request)"] : []) + (({{ include "gfd.cel.hasLimit" . }}) && ({{ include "gfd.cel.quantity" . }}) && x[1] in variables.byteCaps && quantity(string(c.opaque.parameters.memoryLimit)).compareTo(quantity(variables.byteCaps[x[1]])) > 0 ? ["memoryLimit " + string(c.opaque.parameters.memoryLimit) + " on request " + x[0] + " exceeds what DeviceClass " + x[1] + " allows (" + variables.byteCaps[x[1]] + ")"] : []) + (({{ include "gfd.cel.hasLimit" . }}) && ({{ include "gfd.cel.quantity" . }}) && x[1] in variables.noBurst && x[3] != "" && isQuantity(x[3]) && quantity(string(c.opaque.parameters.memoryLimit)).compareTo(quantity(x[3])) > 0 ? ["memoryLimit " + string(c.opaque.parameters.memoryLimit) + " on request " + x[0] + " exceeds its requested memory " + x[3] + ": DeviceClass " + x[1] + " allows no burst (an admin allows it with a cap)"] : []) + (has(c.opaque.parameters.activeThreadPercentage) && ({{ include "gfd.cel.percentage" . }}) && x[1] in variables.threadCaps && c.opaque.parameters.activeThreadPercentage > variables.threadCaps[x[1]] ? ["activeThreadPercentage " + string(c.opaque.parameters.activeThreadPercentage) + " on request " + x[0] + " exceeds what DeviceClass " + x[1] + " allows (" + string(variables.threadCaps[x[1]]) + ")"] : [])
{{- end -}}

{{/* CEL map: DeviceClass -> the largest memoryLimitPortion its claims may ask (double). */}}
{{- define "gfd.cel.portionCaps" -}}
{{- $entries := list -}}
{{- range (include "gfd.classInfo" . | fromJsonArray) -}}
{{- $caps := include "gfd.capsOf" (dict "root" $ "name" .name) | fromJson -}}
{{- if $caps.portion -}}
{{- $entries = append $entries (printf "%q: double(%q)" .name $caps.portion) -}}
{{- else if and (not $caps.memoryCapped) (gt (int .den) 0) -}}
{{- $entries = append $entries (printf "%q: %d.0 / %d.0" .name (int .num) (int .den)) -}}
{{- end -}}
{{- end -}}
{{- printf "{%s}" (join ", " $entries) -}}
{{- end -}}

{{/* CEL map: DeviceClass -> the largest memoryLimit its claims may ask (quantity string). */}}
{{- define "gfd.cel.byteCaps" -}}
{{- $entries := list -}}
{{- range (include "gfd.classInfo" . | fromJsonArray) -}}
{{- $caps := include "gfd.capsOf" (dict "root" $ "name" .name) | fromJson -}}
{{- if $caps.bytes -}}
{{- $entries = append $entries (printf "%q: %q" .name $caps.bytes) -}}
{{- end -}}
{{- end -}}
{{- printf "{%s}" (join ", " $entries) -}}
{{- end -}}

{{/* CEL map: DeviceClass -> the largest activeThreadPercentage its claims may ask. */}}
{{- define "gfd.cel.threadCaps" -}}
{{- $entries := list -}}
{{- range (include "gfd.classInfo" . | fromJsonArray) -}}
{{- $caps := include "gfd.capsOf" (dict "root" $ "name" .name) | fromJson -}}
{{- if $caps.threads -}}
{{- $entries = append $entries (printf "%q: %s" .name $caps.threads) -}}
{{- end -}}
{{- end -}}
{{- printf "{%s}" (join ", " $entries) -}}
{{- end -}}

{{/* CEL list: capacity classes without a memory cap (a ceiling may not exceed the request). */}}
{{- define "gfd.cel.noBurst" -}}
{{- $entries := list -}}
{{- range (include "gfd.classInfo" . | fromJsonArray) -}}
{{- $caps := include "gfd.capsOf" (dict "root" $ "name" .name) | fromJson -}}
{{- if and (not $caps.memoryCapped) (eq (int .den) 0) -}}
{{- $entries = append $entries (printf "%q" .name) -}}
{{- end -}}
{{- end -}}
{{- printf "[%s]" (join ", " $entries) -}}
{{- end -}}
