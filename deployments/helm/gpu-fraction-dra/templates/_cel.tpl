{{/*
CEL fragments of the claim-parameters policy. Each rule is one predicate over `c`, a config
entry of this driver whose opaque parameters are an object (variables.configs); the policy
uses it both to validate (all entries pass) and to word the message (the first that fails).
The rules mirror dra_driver/params.py.
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
